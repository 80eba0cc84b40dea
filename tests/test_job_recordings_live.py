"""Background commands' recordings through a real server (mcpserver/job_recordings.py): a terminal_exec_background
command, a `background_after` one and a terminal session fed through terminal_input are recorded whole, replayed and
downloaded from the page of the call that started them (while they run, too), kept by a `background.ended` event
whose SHA-256 `audit_verify` checks, and linked from the console's page of background commands."""

from __future__ import annotations

import gzip
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.live import LiveServer, make_server, mcp_client, running_server, text_of
from tests.oauth_flow import AdminSession

pytestmark = [pytest.mark.live, pytest.mark.anyio]
DEADLINE = 30.0
SLOW = "echo one; sleep 0.5; printf '\\033[32mgreen\\033[0m\\n'; echo warn >&2; sleep 0.5; echo two"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("job-recordings")) as live:
        yield live


@pytest.fixture(scope="module")
def admin(server: LiveServer) -> Iterator[AdminSession]:
    session = AdminSession(server)
    yield session
    session.close()


def newest_call(server: LiveServer, tool: str) -> dict[str, Any]:
    rows = server.database.query(
        "SELECT id, call_id FROM audit_auditrecord WHERE kind = 'call.started' AND tool = %s ORDER BY id DESC", tool
    )
    return dict(rows[0])


def ended_event(server: LiveServer, call_id: str) -> dict[str, Any]:
    """The `background.ended` event of the job `call_id` started, once the server has kept its recording."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        rows = server.database.query(
            "SELECT detail FROM audit_auditrecord WHERE kind = 'event' AND event = 'background.ended' AND call_id = %s",
            call_id,
        )
        if rows:
            return dict(json.loads(rows[0]["detail"]))
        time.sleep(0.2)
    raise AssertionError(f"no background.ended event for call {call_id}")


def cast_of(admin: AdminSession, call_id: str) -> list[Any]:
    answer = admin.http.get(f"/admin/audit/calls/{call_id}/recording.cast?download=1")
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines()]


def verify(server: LiveServer) -> subprocess.CompletedProcess[str]:
    return server.manage("audit_verify", check=False)


async def test_a_background_command_is_recorded_and_its_recording_kept_in_the_chain(
    server: LiveServer, admin: AdminSession
) -> None:
    async with mcp_client(server.mcp_url, server.create_token("job-rec")) as client:
        started = await client.call_tool("terminal_exec_background", {"command": SLOW})
        assert not started.is_error, text_of(started)
        call = newest_call(server, "terminal_exec_background")
        page = admin.http.get(f"/admin/audit/auditrecord/{call['id']}/change/")
        assert page.status_code == 200
        detail = ended_event(server, call["call_id"])
    described = detail["recording"]
    assert detail["state"] == "exited" and detail["exit_code"] == 0 and described["events"] >= 4
    path = server.state_dir / "recordings" / described["name"]
    with gzip.open(path, "rt") as stream:
        header, *events = [json.loads(line) for line in stream]
    assert header["call_id"] == call["call_id"] and header["tool"] == "terminal_exec_background"
    assert "".join(text for _at, code, text in events if code == "o") == "one\n\x1b[32mgreen\x1b[0m\ntwo\n"
    assert "".join(text for _at, code, text in events if code == "e") == "warn\n"
    times = [at for at, _code, _text in events]
    assert times == sorted(times) and times[-1] - times[0] > 0.8, "the pauses are in the recording"

    first, *rest = cast_of(admin, call["call_id"])
    assert first["version"] == 2 and "terminal_exec_background" in first["title"]
    played = "".join(text for _at, _code, text in rest)
    assert "one\r\n" in played and "\x1b[32mgreen\x1b[0m\r\n" in played and "warn\r\n" in played
    call_page = admin.http.get(f"/admin/audit/auditrecord/{call['id']}/change/").text
    assert 'id="recording-player"' in call_page and "recording-running" not in call_page

    jobs_page = admin.http.get("/admin/mcpserver/backgroundprocess/").text
    assert f"/admin/audit/auditrecord/{call['id']}/change/#recording" in jobs_page and "▶ replay" in jobs_page

    events_page = admin.http.get("/admin/audit/securityevent/").text
    assert f"background command {detail['pid']} (" in events_page
    assert "ended with exit code 0; its recording is kept (" in events_page

    assert verify(server).returncode == 0, verify(server).stdout
    original = path.read_bytes()
    with gzip.open(path, "rt") as stream:
        forged = stream.read().replace("two", "TWO")
    path.write_bytes(gzip.compress(forged.encode()))
    changed = verify(server)
    assert changed.returncode == 1 and described["name"] in changed.stdout + changed.stderr
    path.write_bytes(original)
    assert verify(server).returncode == 0


async def test_a_running_job_is_replayed_so_far_from_its_calls_page(server: LiveServer, admin: AdminSession) -> None:
    async with mcp_client(server.mcp_url, server.create_token("job-running")) as client:
        started = await client.call_tool("terminal_exec_background", {"command": "echo early; sleep 4; echo late"})
        assert not started.is_error
        call = newest_call(server, "terminal_exec_background")
        end = time.monotonic() + DEADLINE
        played = ""
        while "early" not in played and time.monotonic() < end:
            answer = admin.http.get(f"/admin/audit/calls/{call['call_id']}/recording.cast")
            lines = answer.text.splitlines()[1:] if answer.status_code == 200 else []  # the title names the command
            played = "".join(json.loads(line)[2] for line in lines)
            time.sleep(0.2)
        assert "early" in played and "late" not in played
        page = admin.http.get(f"/admin/audit/auditrecord/{call['id']}/change/").text
        assert 'id="recording-running"' in page and 'id="recording-player"' in page
        detail = ended_event(server, call["call_id"])
    assert "late\r\n" in "".join(text for _at, _code, text in cast_of(admin, call["call_id"])[1:])
    assert detail["recording"]["events"] == 2


async def test_a_command_carried_on_by_background_after_is_recorded_whole(
    server: LiveServer, admin: AdminSession
) -> None:
    async with mcp_client(server.mcp_url, server.create_token("job-after")) as client:
        result = await client.call_tool(
            "terminal_exec", {"command": "echo before; sleep 2; echo after; echo bye >&2", "background_after": 0.5}
        )
        assert "carried on as background process" in text_of(result)
        call = newest_call(server, "terminal_exec")
        detail = ended_event(server, call["call_id"])
    assert detail["exit_code"] == 0
    played = "".join(text for _at, _code, text in cast_of(admin, call["call_id"])[1:])
    assert "before\r\n" in played and "after\r\n" in played and "bye\r\n" in played


async def test_a_terminal_session_keeps_the_input_typed_through_terminal_input(
    server: LiveServer, admin: AdminSession
) -> None:
    async with mcp_client(server.mcp_url, server.create_token("job-pty")) as client:
        started = await client.call_tool(
            "terminal_exec_background", {"command": "read -p 'Name? ' name; echo \"hi $name\"", "pty": True}
        )
        pid = int(text_of(started).split()[1])  # "PID: 1234\n..."
        waited = await client.call_tool("terminal_output", {"id": pid, "wait_ms": 5000})
        assert "Name? " in text_of(waited)
        typed = await client.call_tool("terminal_input", {"id": pid, "text": "ada\r"})
        assert not typed.is_error, text_of(typed)
        call = newest_call(server, "terminal_exec_background")
        detail = ended_event(server, call["call_id"])
    path = server.state_dir / "recordings" / detail["recording"]["name"]
    with gzip.open(path, "rt") as stream:
        header, *events = [json.loads(line) for line in stream]
    assert header["pty"] is True
    assert ["i", "ada\r"] in [event[1:] for event in events]
    cast = cast_of(admin, call["call_id"])
    assert ["i", "ada\r"] in [event[1:] for event in cast[1:]]
    assert "hi ada" in "".join(text for _at, code, text in cast[1:] if code == "o")


async def test_a_job_of_a_server_that_stopped_is_recorded_by_the_next(tmp_path: Any) -> None:
    server = make_server(tmp_path)  # one server restarted on its state (and database), as an upgrade does
    server.start()
    try:
        async with mcp_client(server.mcp_url, server.create_token("job-restart")) as client:
            started = await client.call_tool("terminal_exec_background", {"command": "echo a; sleep 3; echo b"})
            assert not started.is_error
        call = newest_call(server, "terminal_exec_background")
        time.sleep(1.5)  # the server has begun its recording
        server.stop()
        [partial] = (server.state_dir / "recordings").glob(f"*/{call['call_id']}.jsonl.gz")
        with gzip.open(partial, "rt") as stream:
            assert "a\\n" in stream.read(), "the first server process recorded the beginning"
        server.start()
        detail = ended_event(server, call["call_id"])
        with gzip.open(server.state_dir / "recordings" / detail["recording"]["name"], "rt") as stream:
            _header, *events = [json.loads(line) for line in stream]
        assert [event[1:] for event in events] == [["o", "a\n"], ["o", "b\n"]], "written again from the start, once"
        assert detail["recording"]["events"] == 2
        assert server.manage("audit_verify", check=False).returncode == 0
    finally:
        server.stop()
