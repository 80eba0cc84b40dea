"""The git layer's own defences over MCP, as an agent meets them: a read-only token's git_status and git_diff on a
repository with a populated, filtered submodule, its git_log and git_diff on one borrowing objects from outside the
workspace, and a full token's git_push on a repository whose config would force. With the server as configured and
with `SANDSTORM_KERNEL_CONFINEMENT=off`, when only the git layer stands."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import hostile_git
from tests.live import LiveServer, mcp_client, running_server, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]


@pytest.fixture(scope="module", params=["default", "off"])
def server(
    request: pytest.FixtureRequest, live_server: LiveServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    if request.param == "default":
        yield live_server
        return
    with running_server(tmp_path_factory.mktemp("unconfined"), SANDSTORM_KERNEL_CONFINEMENT="off") as unconfined:
        yield unconfined


@pytest.fixture(scope="module")
def tokens(server: LiveServer) -> dict[str, str]:
    return {scope: server.create_token(f"gitlayer-{uuid.uuid4().hex[:8]}", scope) for scope in ("mcp:read", "mcp")}


@pytest.fixture
def place(server: LiveServer) -> Path:
    path = server.workspace / f"t-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    return path


async def test_a_read_only_token_never_runs_a_populated_submodules_filter(
    server: LiveServer, tokens: dict[str, str], place: Path, git_env: dict[str, str]
) -> None:
    hostile = hostile_git.build(place, "submodule-filter-not-ignored", git_env)
    async with mcp_client(server.mcp_url, tokens["mcp:read"]) as client:
        for tool in ("git_status", "git_diff"):
            result = await client.call_tool(tool, {"path": str(hostile.repo)})
            assert not result.is_error, text_of(result)
            assert not hostile.marker.exists(), f"{tool} ran the submodule's filter"


async def test_a_read_only_token_cannot_read_objects_from_outside_the_workspace(
    server: LiveServer, tokens: dict[str, str], place: Path, git_env: dict[str, str], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(outside)], check=True, env=git_env)
    (outside / "secret.txt").write_text("the outside secret\n")
    subprocess.run([*git, "add", "secret.txt"], cwd=outside, check=True, env=git_env)
    subprocess.run([*git, "commit", "-q", "-m", "Outside commit"], cwd=outside, check=True, env=git_env)
    subprocess.run([*git, "clone", "-q", "--shared", str(outside), str(place / "repo")], check=True, env=git_env)
    (place / "repo" / "secret.txt").write_text("changed\n")
    async with mcp_client(server.mcp_url, tokens["mcp:read"]) as client:
        for tool in ("git_log", "git_diff"):
            result = await client.call_tool(tool, {"path": str(place / "repo")})
            assert result.is_error and "reads objects from outside the workspace" in text_of(result)
            assert "Outside commit" not in text_of(result) and "outside secret" not in text_of(result)


async def test_git_push_never_forces_because_of_the_repositorys_config(
    server: LiveServer, tokens: dict[str, str], place: Path, git_env: dict[str, str], bare_remote: Path
) -> None:
    repo = place / "repo"

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, env=git_env, check=True, capture_output=True, text=True)
        return done.stdout

    subprocess.run(["git", "clone", "-q", str(bare_remote), str(repo)], check=True, env=git_env)
    git("commit", "-q", "--allow-empty", "-m", "Remote only")
    git("push", "-q", "origin", "main")
    git("push", "-q", "origin", "main:keep")
    kept = git("rev-parse", "HEAD")
    git("reset", "-q", "--hard", "HEAD~1")
    git("commit", "-q", "--allow-empty", "-m", "Local only")
    git("config", "remote.origin.push", "+refs/heads/main:refs/heads/main")
    git("config", "remote.origin.mirror", "true")
    async with mcp_client(server.mcp_url, tokens["mcp"]) as client:
        result = await client.call_tool("git_push", {"path": str(repo)})
    assert result.is_error and "remote.origin.push = +refs/heads/main:refs/heads/main" in text_of(result)
    refs = subprocess.run(["git", "for-each-ref"], cwd=bare_remote, env=git_env, capture_output=True, text=True)
    assert f"{kept.strip()} commit\trefs/heads/main" in refs.stdout and "refs/heads/keep" in refs.stdout
