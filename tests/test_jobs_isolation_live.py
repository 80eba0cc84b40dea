"""A background command is its user's (issue 31), over MCP against the live server: its log is where no other
user's tools read or rewrite it, another user's terminal_kill is refused with nothing signalled, and revoking the
token that started it ends even what it left running in a session of its own (`setsid … &`)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from mcp import Client

from tests.live import LiveServer, apoll, mcp_client, text_of
from tests.oauth_flow import shell

pytestmark = [pytest.mark.live, pytest.mark.anyio]
DEADLINE = 20.0
STARTED = re.compile(r"PID: (\d+)\n")


def user_token(server: LiveServer, scope: str = "mcp") -> tuple[str, str]:
    """A new user and a token of theirs named as they are: (username, token). Its confinement is `host`: what is
    tested here must hold without the kernel's sandbox (a `host` credential has none)."""
    name = f"iso-{uuid.uuid4().hex[:8]}"
    code = (
        "from django.contrib.auth import get_user_model; from oauth.tokens import issue_token; "
        f"print(issue_token(get_user_model().objects.create_user({name!r}), {name!r}, scope={scope!r}, "
        "confinement='host')[1])"
    )
    return name, shell(server, code).strip().splitlines()[-1]


def named(name: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["cmdline"] and process.info["cmdline"][0] == name:
            if process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


@pytest.fixture
def marker() -> Iterator[str]:
    """A process name of this test's own; whatever still runs under it at the end is killed."""
    name = f"x{uuid.uuid4().hex[:8]}"
    yield name
    for process in named(name):
        process.kill()


async def call(client: Client, tool: str, **arguments: Any) -> tuple[str, bool]:
    result = await client.call_tool(tool, arguments)
    return text_of(result), bool(result.is_error)


async def start(client: Client, command: str) -> tuple[int, str]:
    result = await client.call_tool("terminal_exec_background", {"command": command})
    text = text_of(result)
    found = STARTED.match(text)
    assert not result.is_error and found is not None, text
    return int(found[1]), text.rsplit("Output: ", 1)[1].strip()


async def test_another_users_tools_neither_read_nor_rewrite_a_jobs_log(live_server: LiveServer) -> None:
    _, owner_token = user_token(live_server)
    _, reader_token = user_token(live_server, "mcp:read")
    _, writer_token = user_token(live_server)
    async with mcp_client(live_server.mcp_url, owner_token) as owner:
        pid, log = await start(owner, "echo the-owners-secret")
        assert not log.startswith(str(live_server.workspace)), log
        async with mcp_client(live_server.mcp_url, reader_token) as reader:
            text, is_error = await call(reader, "file_read", path=log)
            assert is_error and "is outside the allowed directory" in text, text
            text, is_error = await call(reader, "file_grep", pattern="the-owners-secret")
            assert "the-owners-secret" not in text or "bg-" not in text, text
            text, is_error = await call(reader, "file_glob", pattern="**/bg-*.log")
            assert "bg-" not in text, text
        async with mcp_client(live_server.mcp_url, writer_token) as writer:
            text, is_error = await call(writer, "file_write", path=log, content="forged\n")
            assert is_error and "is outside the allowed directory" in text, text
        text, is_error = await call(owner, "terminal_output", id=pid, offset=0, wait_ms=5000)
        assert not is_error and text.endswith("\n\nthe-owners-secret\n"), text


async def test_another_users_terminal_kill_is_refused_and_signals_nothing(live_server: LiveServer, marker: str) -> None:
    _, owner_token = user_token(live_server)
    other, other_token = user_token(live_server)
    async with mcp_client(live_server.mcp_url, owner_token) as owner:
        pid, _ = await start(owner, f"exec -a {marker} sleep 283")
        await apoll(lambda: named(marker), DEADLINE, "the job to run")
        async with mcp_client(live_server.mcp_url, other_token) as intruder:
            assert await call(intruder, "terminal_kill", pid=pid) == (f"Process {pid} was not started by {other}", True)
        assert [process.pid for process in named(marker)] == [pid]
        assert await call(owner, "terminal_kill", pid=pid) == (f"Sent SIGTERM to {pid}", False)
        await apoll(lambda: not named(marker), DEADLINE, "the owner's terminal_kill to end it")


async def test_revoking_the_token_ends_what_its_job_left_in_a_session_of_its_own(
    live_server: LiveServer, marker: str
) -> None:
    name, token = user_token(live_server)
    async with mcp_client(live_server.mcp_url, token) as client:
        await start(client, f"setsid bash -c 'exec -a {marker} sleep 283' &")
    await apoll(lambda: named(marker), DEADLINE, f"{marker} to run")
    live_server.manage("revoke_token", name)
    await apoll(lambda: not named(marker), DEADLINE, f"{marker} to end with the revocation")
