"""No git tool runs a program a repository names, over MCP: every vector of tests/hostile_git.py against the live
server, with a read-only (`mcp:read`) token calling the read tools and a full token calling all nine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import hostile_git
from tests.live import LiveServer, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

SCOPES = ("mcp:read", "mcp")


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with hostile_git.unauthorized_http() as url:
        yield url


@pytest.fixture(scope="module")
def tokens(live_server: LiveServer) -> dict[str, str]:
    return {scope: live_server.create_token(f"hostile-{uuid.uuid4().hex[:8]}", scope) for scope in SCOPES}


# A read-only token calls the read tools only, so it meets the vectors those reach; a full token meets them all.
CASES = [("mcp:read", vector) for vector in hostile_git.READ_REACHABLE] + [("mcp", v) for v in hostile_git.VECTORS]


@pytest.mark.parametrize(("scope", "vector"), CASES, ids=[f"{scope}-{vector}" for scope, vector in CASES])
async def test_no_git_tool_runs_a_program_the_repository_names(
    live_server: LiveServer,
    tokens: dict[str, str],
    workspace_dir: Path,
    git_env: dict[str, str],
    http_url: str,
    scope: str,
    vector: str,
) -> None:
    hostile = hostile_git.build(workspace_dir, vector, git_env, http_url)
    async with mcp_client(live_server.mcp_url, tokens[scope]) as client:
        for tool, arguments in hostile_git.calls(hostile, writes=scope == "mcp"):
            result = await client.call_tool(tool, {**arguments, "path": str(workspace_dir / hostile.path)})
            assert not result.is_error or "does not allow" not in text_of(result)
            ran = f"{vector} ({scope}): {tool}({arguments}) ran the payload:\n{text_of(result)}"
            assert not hostile.marker.exists(), ran


async def test_the_issues_two_read_only_attacks_are_refused_or_harmless(
    live_server: LiveServer, tokens: dict[str, str], workspace_dir: Path, git_env: dict[str, str]
) -> None:
    """git_log on a nested bare repository with gpg.program; git_status on one that moves its working tree."""
    gpg = hostile_git.build(workspace_dir / "gpg", "nested-bare-gpg", git_env)
    moved = hostile_git.build(workspace_dir / "moved", "nested-bare-worktree-fsmonitor", git_env)
    async with mcp_client(live_server.mcp_url, tokens["mcp:read"]) as client:
        log = await client.call_tool("git_log", {"path": str(gpg.root / gpg.path)})
        assert not log.is_error and text_of(log).endswith(" Initial commit")
        status = await client.call_tool("git_status", {"path": str(moved.root / moved.path)})
        assert status.is_error and "its config moves the working tree" in text_of(status)
    assert not gpg.marker.exists() and not moved.marker.exists()
