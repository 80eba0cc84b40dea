"""Recordings through a real server: a command's output kept whole, in order, with its timing and its streams apart,
downloadable as asciicast v2 by staff; the finished record holds the recording's SHA-256 and `audit_verify` catches a
recording changed or missing; a full budget leaves calls unrecorded, never failed."""

from __future__ import annotations

import gzip
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.live import LiveServer, mcp_client, running_server, text_of
from tests.oauth_flow import AdminSession

pytestmark = [pytest.mark.live, pytest.mark.anyio]

# Four lines a second apart or so, one on stderr, the last printed just before the exit.
COMMAND = "echo a; sleep 0.4; echo b; echo oops >&2; sleep 0.4; printf '\\033[31mred\\033[0m\\n'; echo d; echo last >&2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("recordings")) as live:
        yield live


@pytest.fixture(scope="module")
def admin(server: LiveServer) -> Iterator[AdminSession]:
    session = AdminSession(server)
    yield session
    session.close()


def finished_detail(server: LiveServer, call_id: str) -> dict[str, Any]:
    [row] = server.database.query(
        "SELECT detail FROM audit_auditrecord WHERE kind = 'call.finished' AND call_id = %s", call_id
    )
    return json.loads(row["detail"]) if row["detail"] else {}


def newest_call_id(server: LiveServer, tool: str) -> str:
    rows = server.database.query(
        "SELECT call_id FROM audit_auditrecord WHERE kind = 'call.started' AND tool = %s ORDER BY id DESC", tool
    )
    return str(rows[0]["call_id"])


async def run(server: LiveServer, command: str) -> str:
    async with mcp_client(server.mcp_url, server.create_token(f"rec-{abs(hash(command)) % 10**8}")) as client:
        result = await client.call_tool("terminal_exec", {"command": command})
    assert not result.is_error, text_of(result)
    return newest_call_id(server, "terminal_exec")


def verify(server: LiveServer) -> subprocess.CompletedProcess[str]:
    return server.manage("audit_verify", check=False)


async def test_a_commands_output_is_recorded_whole_in_order_with_its_timing(
    server: LiveServer, admin: AdminSession
) -> None:
    call_id = await run(server, COMMAND)
    described = finished_detail(server, call_id)["recording"]
    path = server.state_dir / "recordings" / described["name"]
    assert path.is_file() and oct(path.stat().st_mode & 0o777) == "0o600"
    with gzip.open(path, "rt") as stream:
        header, *events = [json.loads(line) for line in stream]
    assert header["call_id"] == call_id and header["tool"] == "terminal_exec"
    streams = [(code, text) for _at, code, text in events]
    assert "".join(text for code, text in streams if code == "o") == "a\nb\n\x1b[31mred\x1b[0m\nd\n"
    assert "".join(text for code, text in streams if code == "e") == "oops\nlast\n"  # the last, just before the exit
    assert [at for at, _code, _text in events] == sorted(at for at, _code, _text in events)
    times = {text.strip(): at for at, _code, text in events}
    assert times["b"] - times["a"] >= 0.35, events  # the pause is in the recording
    assert described["events"] == len(events) and not described["cut"]

    cast = admin.http.get(f"/admin/audit/calls/{call_id}/recording.cast?download=1")
    assert cast.status_code == 200, cast.text
    assert cast.headers["content-disposition"] == f'attachment; filename="sandstorm-{call_id}.cast"'
    first, *rest = [json.loads(line) for line in cast.text.splitlines()]
    assert first["version"] == 2 and first["width"] > 0 and first["height"] > 0 and "terminal_exec" in first["title"]
    assert all(code == "o" for _at, code, _text in rest)
    played = "".join(text for _at, _code, text in rest)
    assert "a\r\nb\r\n" in played and "\x1b[31mred\x1b[0m\r\n" in played and "d\r\n" in played and "last\r\n" in played


async def test_a_stranger_and_a_made_up_call_get_no_recording(server: LiveServer, admin: AdminSession) -> None:
    call_id = await run(server, "echo secret-ish")
    anonymous = admin.http.__class__(base_url=server.url, follow_redirects=False)
    assert anonymous.get(f"/admin/audit/calls/{call_id}/recording.cast").status_code == 302  # to the sign-in page
    assert admin.http.get("/admin/audit/calls/../../etc/recording.cast").status_code == 404
    assert admin.http.get("/admin/audit/calls/0123456789abcdef/recording.cast").status_code == 404


async def test_audit_verify_catches_a_recording_changed_or_missing(server: LiveServer) -> None:
    call_id = await run(server, "echo keep me")
    assert verify(server).returncode == 0, verify(server).stdout
    path = server.state_dir / "recordings" / finished_detail(server, call_id)["recording"]["name"]
    original = path.read_bytes()
    with gzip.open(path, "rt") as stream:
        lines = stream.read().replace("keep me", "keep it")
    path.write_bytes(gzip.compress(lines.encode()))
    changed = verify(server)
    assert changed.returncode == 1 and call_id in changed.stderr + changed.stdout and "recording" in changed.stderr
    path.unlink()
    missing = verify(server)
    assert missing.returncode == 1 and "missing" in missing.stderr
    path.write_bytes(original)
    assert verify(server).returncode == 0


async def test_a_full_budget_leaves_calls_unrecorded_not_failed(tmp_path: Path) -> None:
    with running_server(tmp_path, SANDSTORM_RECORDINGS_MAX_BYTES="1") as small:
        await run(small, "echo first")  # the budget is met once something is recorded
        call_id = await run(small, "echo second")
        health = httpx2.get(f"{small.url}/health", timeout=10).json()
        assert health["ok"] and health["recordings"]["full"] and health["recordings"]["budget"] == 1
        home = AdminSession(small)
        try:
            status = home.http.get("/admin/").text
        finally:
            home.close()
        assert 'id="status-recordings"' in status and "new calls are not recorded" in status
        assert finished_detail(small, call_id)["recording"] == {
            "unrecorded": ("the recordings' disk budget (SANDSTORM_RECORDINGS_MAX_BYTES) is full")
        }
