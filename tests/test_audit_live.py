"""The audit log as written by a real server: every call recorded before it runs and after, denials, secrets
redacted, large values cut, calls of a killed server marked interrupted, security events. (Fail-closed, the
rate-limited call's record and the flood of bad tokens: tests/test_audit_inprocess.py.)"""

from __future__ import annotations

import hashlib
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psutil
import pytest
from mcp import MCPError

from tests.database import Row
from tests.live import LiveServer, make_server, mcp_client, poll

pytestmark = [pytest.mark.live, pytest.mark.anyio]


def query(server: LiveServer, sql: str, *params: Any) -> list[Row]:
    return server.database.query(sql, *params)


def records_of_call(server: LiveServer, marker: str) -> list[Row]:
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    started = query(server, sql, f"%{marker}%")
    assert len(started) == 1, started
    return query(server, "SELECT * FROM audit_auditrecord WHERE call_id=%s ORDER BY id", started[0]["call_id"])


def token_id(server: LiveServer, name: str) -> str:
    return str(query(server, "SELECT id FROM oauth_bearertoken WHERE name=%s", name)[0]["id"])


async def test_each_call_has_one_started_and_one_finished_record_with_its_principal(live_server: LiveServer) -> None:
    marker = uuid.uuid4().hex
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        began = time.monotonic()
        await client.call_tool("terminal_exec", {"command": f"echo {marker}; exit 3"})
        elapsed_ms = (time.monotonic() - began) * 1000
    started, finished = records_of_call(live_server, marker)
    assert (started["kind"], finished["kind"]) == ("call.started", "call.finished")
    assert started["id"] < finished["id"] and finished["started_id"] == started["id"]
    for record in (started, finished):
        assert record["tool"] == "terminal_exec"
        assert record["username"] == "admin"
        assert (record["credential_kind"], record["credential_id"]) == ("bearer", token_id(live_server, "bootstrap"))
        assert record["client_address"] == "127.0.0.1" and record["scope"] == "mcp"
        assert record["session_id"] and record["protocol_version"]
    assert json.loads(started["arguments"]) == {
        "command": f"echo {marker}; exit 3",
        "cwd": None,
        "timeout": None,
        "background_after": None,
        "description": None,
    }
    assert (finished["outcome"], finished["exit_code"]) == ("error", 3)
    assert marker in finished["result_excerpt"] and 0 <= finished["duration_ms"] <= elapsed_ms


async def test_a_refused_call_is_recorded_as_denied_with_its_reason(live_server: LiveServer) -> None:
    reader = live_server.create_token("audit-reader", scope="mcp:read")
    marker = uuid.uuid4().hex
    async with mcp_client(live_server.mcp_url, reader) as client:
        await client.call_tool("file_write", {"path": f"{marker}.txt", "content": "x"})
    started, finished = records_of_call(live_server, marker)
    assert finished["outcome"] == "denied"
    assert "does not allow file_write" in finished["reason"]
    assert started["credential_id"] == token_id(live_server, "audit-reader")
    assert not (live_server.workspace / f"{marker}.txt").exists()


async def test_calls_with_bad_arguments_or_unknown_tools_are_recorded_as_denied(live_server: LiveServer) -> None:
    marker = uuid.uuid4().hex
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        bad = await client.call_tool("terminal_exec", {"command": marker, "timeout": "not-a-number"})
        with pytest.raises(MCPError):  # an unknown tool is a protocol error (tests/test_mcp_unknown_names_live.py)
            await client.call_tool("no_such_tool", {"x": marker})
    assert bad.is_error
    bad_records = records_of_call(live_server, f'"command": "{marker}"')
    assert bad_records[-1]["outcome"] == "denied" and bad_records[-1]["tool"] == "terminal_exec"
    unknown_records = records_of_call(live_server, f'"x": "{marker}"')
    assert unknown_records[-1]["outcome"] == "denied" and unknown_records[-1]["tool"] == "no_such_tool"


async def test_secrets_in_arguments_are_redacted_but_hashed_over_the_original(live_server: LiveServer) -> None:
    marker = uuid.uuid4().hex
    command = (
        f"echo {marker}; curl -H 'Authorization: Bearer abcdefgh12345678' https://alice:hunter2@example.com/x; "
        "export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuv"
    )
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        await client.call_tool("terminal_exec", {"command": command, "timeout": 5.0})
    started = records_of_call(live_server, marker)[0]
    stored = started["arguments"]
    for secret in ("abcdefgh12345678", "hunter2", "ghp_abcdefghijklmnopqrstuv"):
        assert secret not in stored
    assert "[REDACTED]" in stored
    original = json.dumps(
        {"command": command, "cwd": None, "timeout": 5.0, "background_after": None, "description": None},
        sort_keys=True,
        ensure_ascii=False,
    ).encode()
    assert started["arguments_sha256"] == hashlib.sha256(original).hexdigest()


async def test_a_large_argument_is_kept_as_head_and_tail_with_size_and_hash(live_server: LiveServer) -> None:
    marker = uuid.uuid4().hex
    content = marker + "a" * (3 * 1024 * 1024) + "THE-END"
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        await client.call_tool("file_write", {"path": f"big-{marker}.txt", "content": content})
    started = records_of_call(live_server, marker)[0]
    stored = json.loads(started["arguments"])["content"]
    assert stored.startswith(marker) and stored.endswith("THE-END") and len(stored) < 3 * 8192
    large = json.loads(started["detail"])["large_arguments"]["content"]
    assert large["size"] == len(content.encode())
    assert large["sha256"] == hashlib.sha256((live_server.workspace / f"big-{marker}.txt").read_bytes()).hexdigest()


async def test_concurrent_calls_from_several_clients_keep_one_unforked_chain(live_server: LiveServer) -> None:
    before = query(live_server, "SELECT COALESCE(MAX(id), 0) AS top FROM audit_auditrecord")[0]["top"]
    tokens = [live_server.token, live_server.create_token("chain-a"), live_server.create_token("chain-b")]

    async def client_calls(token: str) -> None:
        async with mcp_client(live_server.mcp_url, token) as client, anyio.create_task_group() as group:
            for index in range(6):
                group.start_soon(client.call_tool, "terminal_exec", {"command": f"echo chain-{index}"})

    async with anyio.create_task_group() as group:
        for token in tokens:
            group.start_soon(client_calls, token)
    rows = query(
        live_server, "SELECT id, kind, prev_mac, mac, call_id FROM audit_auditrecord WHERE id > %s ORDER BY id", before
    )
    calls = [row for row in rows if row["kind"] != "event"]
    assert len(calls) == 2 * 18
    everything = query(live_server, "SELECT id, prev_mac, mac FROM audit_auditrecord ORDER BY id")
    assert all(
        current["prev_mac"] == previous["mac"] for previous, current in zip(everything, everything[1:], strict=False)
    )
    assert len({row["prev_mac"] for row in everything}) == len(everything)  # no two records chain from one mac


async def test_no_token_value_is_ever_stored(live_server: LiveServer) -> None:
    async with mcp_client(live_server.mcp_url, live_server.token) as client:
        await client.call_tool("terminal_exec", {"command": "echo stored?"})
    dump = "\n".join(str(tuple(row.values())) for row in query(live_server, "SELECT * FROM audit_auditrecord"))
    assert live_server.token not in dump


async def test_token_creation_and_first_use_are_security_events(live_server: LiveServer) -> None:
    token = live_server.create_token("first-use-probe")
    created = query(
        live_server,
        "SELECT * FROM audit_auditrecord WHERE event='token.created' AND CAST(detail AS TEXT) LIKE %s",
        "%first-use-probe%",
    )
    assert len(created) == 1 and created[0]["credential_kind"] == "shell"
    async with mcp_client(live_server.mcp_url, token) as client:
        await client.list_tools()
        await client.list_tools()
    used = query(
        live_server,
        "SELECT * FROM audit_auditrecord WHERE event='token.first_used' AND CAST(detail AS TEXT) LIKE %s",
        "%first-use-probe%",
    )
    assert len(used) == 1 and used[0]["client_address"] == "127.0.0.1"
    assert token not in str(tuple(used[0].values()))


def test_a_call_cut_off_by_a_killed_server_is_marked_interrupted_after_restart(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.start()
    marker = uuid.uuid4().hex

    async def start_call() -> None:
        async with mcp_client(server.mcp_url, server.token) as client, anyio.create_task_group() as group:
            group.start_soon(client.call_tool, "terminal_exec", {"command": f"touch {marker}; sleep 60"})
            await anyio.to_thread.run_sync(lambda: poll(lambda: (server.workspace / marker).exists(), 15, what="call"))
            assert server.process is not None
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
            group.cancel_scope.cancel()

    try:
        anyio.run(start_call)
    except* httpx2.TransportError:
        pass  # the client loses its connection with the server; that is the point
    started = records_of_call(server, marker)
    assert [row["kind"] for row in started] == ["call.started"]
    server.start()
    try:
        rows = records_of_call(server, marker)
        assert [row["kind"] for row in rows] == ["call.started", "call.finished"]
        assert rows[1]["outcome"] == "interrupted"
    finally:
        server.stop()
        # SIGKILL gave the server no chance to stop the call's process group: end it here.
        for process in psutil.process_iter(["cmdline"]):
            if marker in " ".join(process.info["cmdline"] or []):
                process.kill()
