"""terminal_output, terminal_list and terminal_input over MCP against the live server, in both protocol eras: a
background command followed by offset to its exit code, waits, input through stdin and a terminal, terminal_exec's
background_after, another user's and a read-only credential's view, and a command that outlives a server restart."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client

from tests.live import LiveServer, make_server, mcp_client, text_of
from tests.oauth_flow import shell

pytestmark = [pytest.mark.live, pytest.mark.anyio]

DEADLINE = 30.0  # seconds to follow a command to its end: the machine may be loaded
STARTED = re.compile(r"PID: (\d+)\n")
NEVER_STARTED = 999_999_999  # above any pid_max
Call = tuple[str, bool, dict[str, Any]]


@pytest.fixture(params=["legacy", "2026-07-28"])
async def client(request: pytest.FixtureRequest, live_server: LiveServer, tool_token: str) -> AsyncIterator[Client]:
    async with mcp_client(live_server.mcp_url, tool_token, mode=request.param) as connected:
        yield connected


@pytest.fixture
def commands() -> Iterator[list[str]]:
    """The commands a test starts: any still running at its end (a failed test) is killed with its group."""
    started: list[str] = []
    yield started
    for proc in psutil.process_iter(["cmdline"]):
        if (
            proc.info["cmdline"]
            and proc.info["cmdline"][:2] == ["bash", "-c"]
            and proc.info["cmdline"][2:] in [[command] for command in started]
        ):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def call(client: Client, tool: str, **arguments: Any) -> Call:
    result = await client.call_tool(tool, arguments)
    return text_of(result), bool(result.is_error), result.structured_content or {}


async def start(client: Client, commands: list[str], command: str, **options: Any) -> int:
    commands.append(command)
    text, is_error, _ = await call(client, "terminal_exec_background", command=command, **options)
    found = STARTED.match(text)
    assert not is_error and found is not None, text
    return int(found[1])


async def follow(client: Client, pid: int, offset: int = 0) -> tuple[str, Call]:
    """The output from `offset` to the command's end, read by next_offset, and the last call's answer."""
    output, end = "", time.monotonic() + DEADLINE
    while time.monotonic() < end:
        answer = await call(client, "terminal_output", id=pid, offset=offset, wait_ms=2000)
        text, is_error, structured = answer
        assert not is_error and structured["offset"] == offset, text
        output += text.split("\n\n", 1)[1] if structured["next_offset"] > offset else ""
        offset = structured["next_offset"]
        if structured["state"] != "running":
            return output, answer
    raise AssertionError(f"{pid} still running after {DEADLINE}s; output so far: {output!r}")


async def test_a_command_is_followed_by_offset_to_its_exit_code_and_its_tail_read(
    client: Client, commands: list[str]
) -> None:
    pid = await start(client, commands, "for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 3")
    output, (text, _, structured) = await follow(client, pid)
    assert output == "line 1\nline 2\nline 3\n"
    assert (structured["state"], structured["exit_code"], structured["waiting_for_input"]) == ("exited", 3, False)
    assert structured["next_offset"] == structured["size"] == 21
    assert text.startswith(f"Background command {pid}: exited with code 3\n"), text
    text, is_error, structured = await call(client, "terminal_output", id=pid, tail=7)
    assert (
        not is_error and text.endswith("\n\nline 3\n") and (structured["offset"], structured["next_offset"]) == (14, 21)
    )
    assert "Output bytes 14-21 of 21; next offset 21." in text
    assert await call(client, "terminal_output", id=pid, offset=0, tail=7) == (
        "Error: give offset or tail, not both",
        True,
        {},
    )


async def test_a_wait_ends_with_the_first_output_or_after_wait_ms(client: Client, commands: list[str]) -> None:
    pid = await start(client, commands, "sleep 1; echo ready; sleep 30")
    begun = time.monotonic()
    text, is_error, structured = await call(client, "terminal_output", id=pid, offset=0, wait_ms=10_000)
    assert time.monotonic() - begun < 5 and not is_error
    assert text == f"Background command {pid}: running\nOutput bytes 0-6 of 6; next offset 6.\n\nready\n"
    begun = time.monotonic()
    text, is_error, structured = await call(client, "terminal_output", id=pid, offset=6, wait_ms=300)
    assert 0.25 <= time.monotonic() - begun < 5, "a wait without new output lasts about wait_ms"
    assert not is_error and (structured["state"], structured["next_offset"], structured["size"]) == ("running", 6, 6)
    assert text == f"Background command {pid}: running\nOutput bytes 6-6 of 6; next offset 6."
    killed = await call(client, "terminal_kill", pid=pid)
    assert killed[:2] == (f"Sent SIGTERM to {pid}", False)
    _, (text, _, structured) = await follow(client, pid, 6)
    assert (structured["state"], structured["exit_code"]) == ("killed", 128 + signal.SIGTERM), text
    assert text.startswith(f"Background command {pid}: killed by SIGTERM (exit code 143)"), text


async def test_a_long_wait_sends_progress_while_nothing_comes(client: Client, commands: list[str]) -> None:
    pid = await start(client, commands, "sleep 6; echo at last")
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    result = await client.call_tool(
        "terminal_output", {"id": pid, "offset": 0, "wait_ms": 20_000}, progress_callback=on_progress
    )
    assert not result.is_error and text_of(result).endswith("\n\nat last\n"), text_of(result)
    assert notes and all(note.startswith(f"{pid} is running; no new output after ") for note in notes), notes


@pytest.fixture(scope="module")
def other_token(live_server: LiveServer) -> str:
    """A full-scope token of a user other than the one `tool_token` acts for."""
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    code = (
        "from django.contrib.auth import get_user_model; from oauth.tokens import issue_token; "
        f"print(issue_token(get_user_model().objects.create_user({name!r}), 'other')[1])"
    )
    return shell(live_server, code).strip().splitlines()[-1]


async def test_terminal_list_shows_this_users_commands_and_never_another_users(
    client: Client, live_server: LiveServer, other_token: str, commands: list[str]
) -> None:
    command = f"echo listed-{uuid.uuid4().hex[:8]}; exit 4"
    pid = await start(client, commands, command)
    await follow(client, pid)
    text, is_error, structured = await call(client, "terminal_list")
    mine = [row for row in structured["commands"] if row["id"] == pid]
    assert not is_error and len(mine) == 1, text
    assert {key: mine[0][key] for key in ("command", "state", "exit_code", "output_bytes", "input")} == {
        "command": command, "state": "exited", "exit_code": 4, "output_bytes": 16, "input": "none"
    }  # fmt: skip
    assert f"{pid}  exited with code 4  started " in text and f"  16 bytes\n    {command}" in text
    async with mcp_client(live_server.mcp_url, other_token, mode="2026-07-28") as other:
        text, is_error, structured = await call(other, "terminal_list")
        assert not is_error and all(row["id"] != pid for row in structured["commands"]), text
        text, is_error, _ = await call(other, "terminal_output", id=pid, offset=0)
        assert is_error and re.fullmatch(rf"Error: no background command {pid} was started by jobs-\w+", text), text
        text, is_error, _ = await call(other, "terminal_input", id=pid, text="x")
        assert is_error and text.startswith(f"Error: no background command {pid} was started by jobs-"), text
    text, is_error, _ = await call(client, "terminal_output", id=NEVER_STARTED)
    assert (text, is_error) == (f"Error: no background command {NEVER_STARTED} was started by admin", True)


async def test_a_pty_command_prompts_and_reads_what_is_typed(client: Client, commands: list[str]) -> None:
    pid = await start(client, commands, 'read -p "Name: " name; echo "hello $name"', pty=True)
    seen, offset, end = "", 0, time.monotonic() + DEADLINE
    while True:
        text, is_error, structured = await call(client, "terminal_output", id=pid, offset=offset, wait_ms=500)
        assert not is_error and structured["state"] == "running", text
        seen += text.split("\n\n", 1)[1] if structured["next_offset"] > offset else ""
        offset = structured["next_offset"]
        if "Name: " in seen and structured["waiting_for_input"]:
            break
        assert time.monotonic() < end, f"no prompt waiting for input: {seen!r} {structured}"
    assert text.startswith(f"Background command {pid}: running (waiting for input)\n"), text
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    begun = time.monotonic()  # nothing comes until it is answered: a wait says so at once, it does not sit it out
    waited = await client.call_tool(
        "terminal_output", {"id": pid, "offset": offset, "wait_ms": 20_000}, progress_callback=on_progress
    )
    structured = waited.structured_content or {}
    assert time.monotonic() - begun < 3 and structured["waiting_for_input"] and structured["next_offset"] == offset
    assert notes == []  # answered at once, not after slices of waiting
    text, is_error, structured = await call(client, "terminal_input", id=pid, text="bob\n")
    assert not is_error and (structured["written"], structured["eof"]) == (4, False), text
    assert text.startswith(f"Wrote 4 bytes to background command {pid}. It is ")
    output, (_, _, structured) = await follow(client, pid, offset)
    assert "hello bob" in output and "hello bob" not in seen
    assert (structured["state"], structured["exit_code"]) == ("exited", 0)


async def test_stdin_reaches_a_command_started_with_it_and_only_such(client: Client, commands: list[str]) -> None:
    pid = await start(client, commands, "cat", stdin=True)
    text, is_error, structured = await call(client, "terminal_input", id=pid, text="abc\n", eof=True)
    assert not is_error and (structured["written"], structured["eof"]) == (4, True), text
    assert text.startswith(f"Wrote 4 bytes to background command {pid} and closed its input.")
    output, (_, _, structured) = await follow(client, pid)
    assert output == "abc\n" and (structured["state"], structured["exit_code"]) == ("exited", 0)
    deaf = await start(client, commands, "sleep 0.2")
    text, is_error, _ = await call(client, "terminal_input", id=deaf, text="abc\n")
    assert is_error and f"background command {deaf} was started without stdin" in text, text


async def test_background_after_carries_a_slow_command_on_and_answers_a_quick_one(
    client: Client, commands: list[str]
) -> None:
    commands.append("sleep 3; echo late")
    begun = time.monotonic()
    text, is_error, structured = await call(client, "terminal_exec", command="sleep 3; echo late", background_after=1)
    assert 1.0 <= time.monotonic() - begun < 2.8 and not is_error, text
    pid = structured["id"]
    assert (
        text.startswith(f"Still running after 1s: carried on as background process {pid} ") and f"PID: {pid}\n" in text
    )
    assert (structured["background"], structured["exit_code"]) == (True, None)
    output, (_, _, ended) = await follow(client, pid)
    assert output == "late\n" and (ended["state"], ended["exit_code"]) == ("exited", 0)
    text, is_error, structured = await call(
        client, "terminal_exec", command="echo hi; echo err >&2; exit 2", background_after=5
    )
    assert (text, is_error) == ("output:\nhi\nerr\n\nexit_code: 2", True)
    assert (structured["output"], structured["exit_code"], structured["background"]) == ("hi\nerr\n", 2, False)


async def test_a_read_only_credential_may_follow_but_not_start_or_type(
    request: pytest.FixtureRequest, client: Client, live_server: LiveServer, workspace_dir: Path, commands: list[str]
) -> None:
    mode = request.node.callspec.params["client"]  # the reader speaks the era `client` does
    pid = await start(client, commands, "echo seen", stdin=True)
    reader = live_server.create_token(f"jobs-reader-{uuid.uuid4().hex[:8]}", scope="mcp:read")
    async with mcp_client(live_server.mcp_url, reader, mode=mode) as read_only:
        listed = {tool.name for tool in (await read_only.list_tools()).tools}
        assert {"terminal_output", "terminal_list"} <= listed
        assert not listed & {"terminal_input", "terminal_exec_background"}
        output, _ = await follow(read_only, pid)
        assert output == "seen\n"
        text, is_error, structured = await call(read_only, "terminal_list")
        assert not is_error and any(row["id"] == pid for row in structured["commands"]), text
        refused: list[tuple[str, dict[str, Any]]] = [
            ("terminal_input", {"id": pid, "text": "x"}),
            ("terminal_exec_background", {"command": f"touch {workspace_dir}/made"}),
        ]
        for tool, arguments in refused:
            text, is_error, _ = await call(read_only, tool, **arguments)
            assert (text, is_error) == (f"Error: this credential's scope (mcp:read) does not allow {tool}", True)
    assert not (workspace_dir / "made").exists()


async def test_a_command_outlives_a_server_restart_without_losing_output(tmp_path: Path, commands: list[str]) -> None:
    server = make_server(tmp_path)
    server.start()
    try:
        # Long enough to outlast the restart (seconds on a loaded machine): it is still running when read again.
        command = "for i in $(seq 1 150); do echo tick $i; sleep 0.1; done"
        async with mcp_client(server.mcp_url, server.token, mode="2026-07-28") as before:
            pid = await start(before, commands, command)
            text, is_error, structured = await call(before, "terminal_output", id=pid, offset=0, wait_ms=5000)
        assert not is_error and structured["state"] == "running" and text.split("\n\n", 1)[1].startswith("tick 1\n")
        first = text.split("\n\n", 1)[1]
        server.stop()
        server.start()
        async with mcp_client(server.mcp_url, server.token, mode="2026-07-28") as after:
            _, _, again = await call(after, "terminal_output", id=pid, offset=structured["next_offset"], max_bytes=1)
            assert again["state"] == "running"
            rest, (_, _, ended) = await follow(after, pid, structured["next_offset"])
    finally:
        server.stop()
    assert first + rest == "".join(f"tick {i}\n" for i in range(1, 151))
    assert (ended["state"], ended["exit_code"]) == ("exited", 0)
