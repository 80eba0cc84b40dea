"""Kernel confinement as an agent meets it: a real `make run`-style server, its executor child, the official SDK
client, and credentials of each profile. tests/test_kernel_confinement.py checks the sandboxes themselves."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mcpserver.executor import landlock
from tests.live import REPO, make_server, mcp_client, text_of

try:
    landlock.abi_version()
    LANDLOCK = True
except landlock.LandlockUnavailable:
    LANDLOCK = False

pytestmark = [pytest.mark.live, pytest.mark.anyio]
needs_landlock = pytest.mark.skipif(not LANDLOCK, reason="this kernel has no Landlock")


def confinement_of(url: str) -> dict[str, Any]:
    """/health's word on the kernel's sandbox."""
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        detail: dict[str, Any] = json.loads(answer.read())["executor"]["confinement"]
    return detail


def token(server: object, name: str, *options: str) -> str:
    done = server.manage("create_token", name, *options)  # type: ignore[attr-defined]
    return str(done.stdout.strip().splitlines()[-1])


async def run(url: str, secret: str, command: str) -> tuple[str, bool]:
    async with mcp_client(url, secret) as client:
        result = await client.call_tool("terminal_exec", {"command": command})
    return text_of(result), bool(result.is_error)


@needs_landlock
async def test_profiles_decide_what_a_full_credential_reaches(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.start()
    try:
        key = server.state_dir / "secret_key"
        probe = f"cat {key}; head -c 20 {REPO}/README.md; echo x > {REPO}/planted.txt; echo ok > made.txt; sudo -n id"
        default = token(server, "default")  # development: no profile of its own, the installation's `workspace`
        text, _ = await run(server.mcp_url, default, probe)
        assert key.read_text().strip() not in text
        assert "# Sandstorm" not in text and not (REPO / "planted.txt").exists()
        assert (server.workspace / "made.txt").read_text() == "ok\n"
        assert "this credential is confined to its workspace" in text
        host = token(server, "host", "--confinement", "host")
        text, _ = await run(server.mcp_url, host, f"cat {key}")
        assert key.read_text().strip() in text  # the control: `host` reaches what the server's user reaches
        detail = confinement_of(server.url)
        assert detail["read"] == "enforced" and detail["workspace"] == "enforced"
        assert detail["default_profile"] == "workspace"
        assert "confined to the workspace by default" in server.manage("bootstrap").stdout
    finally:
        server.stop()
        (REPO / "planted.txt").unlink(missing_ok=True)


async def test_without_the_kernel_nothing_is_silent(tmp_path: Path) -> None:
    """Kernel confinement off: /health and the banner say so, the unchosen development default falls back to
    `host` with the warning, and a credential set to `workspace` has its calls refused, not run unconfined."""
    server = make_server(tmp_path, SANDSTORM_KERNEL_CONFINEMENT="off")
    server.start()
    try:
        detail = confinement_of(server.url)
        assert detail["workspace"] == "turned off (SANDSTORM_KERNEL_CONFINEMENT=off)"
        assert detail["default_profile"] == "host"
        assert "development mode: tools run unconfined" in server.log()
        banner = server.manage("bootstrap").stdout
        assert "unconfined: kernel confinement turned off" in banner
        marker = server.workspace / "ran.txt"
        confined = token(server, "confined", "--confinement", "workspace")
        text, is_error = await run(server.mcp_url, confined, f"touch {marker}")
        assert is_error and "this host cannot enforce that" in text and not marker.exists()
        text, is_error = await run(server.mcp_url, token(server, "default"), f"touch {marker}")
        assert not is_error and marker.exists()
    finally:
        server.stop()


@needs_landlock
async def test_no_credential_runs_a_submodule_filter_through_a_read_tool(tmp_path: Path) -> None:
    """The attack's submodule filter through git_status and git_diff: of an mcp:read token, and of full tokens of
    both profiles, `host` included (read tools run in the read sandbox whatever the credential's profile)."""
    server = make_server(tmp_path)
    repo = server.workspace / "repo"
    sub = repo / "sub"
    marker = server.workspace / "MARK"
    sub.mkdir(parents=True)

    def git(cwd: Path, *args: str) -> str:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
        ident = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
        return subprocess.run(
            ["git", *ident, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
        ).stdout

    git(repo, "init", "-q", "-b", "main")
    git(sub, "init", "-q", "-b", "main")
    (sub / ".gitattributes").write_text("* filter=evil\n")
    (sub / "f.txt").write_text("content\n")
    git(sub, "add", ".")
    git(sub, "commit", "-q", "-m", "sub")
    git(sub, "config", "filter.evil.clean", f"sh -c 'touch {marker}; cat'")
    subprocess.run(["touch", "-d", "2001-01-01", str(sub / "f.txt")], check=True)
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{git(sub, 'rev-parse', 'HEAD').strip()},sub")
    server.start()
    try:
        secrets = [
            token(server, "reader", "--scope", "mcp:read"),
            token(server, "full-workspace", "--confinement", "workspace"),
            token(server, "full-host", "--confinement", "host"),
        ]
        for secret in secrets:
            async with mcp_client(server.mcp_url, secret) as client:
                for tool in ("git_status", "git_diff"):
                    result = await client.call_tool(tool, {"path": "repo"})
                    assert not result.is_error, text_of(result)
        assert not marker.exists()
    finally:
        server.stop()
