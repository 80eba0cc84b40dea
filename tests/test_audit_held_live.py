"""A real server whose database is locked past its busy timeout while a call runs, then killed: the call's result
still reaches the client, /health answers 503 while its finished record is held, and the next start writes that
record from the spill file, so the call is recorded as it ended (not as interrupted) and the chain verifies."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.database import requires_sqlite
from tests.live import LiveServer, make_server, mcp_client, poll, text_of
from tests.small_disk import fill, small_tmpfs

pytestmark = [pytest.mark.live, pytest.mark.slow, requires_sqlite]
BUSY_TIMEOUT = 30  # seconds: sandstorm_site/settings.py's SQLite "timeout"


def rows_of_call(server: LiveServer, marker: str) -> list[dict[str, object]]:
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    started = server.database.query(sql, f"%{marker}%")
    if not started:
        return []
    rows = server.database.query("SELECT * FROM audit_auditrecord WHERE call_id=%s ORDER BY id", started[0]["call_id"])
    return [dict(row) for row in rows]


def health(server: LiveServer) -> tuple[int, dict[str, object]]:
    response = httpx2.get(f"{server.url}/health", timeout=5)
    return response.status_code, response.json()


def test_a_finished_record_refused_by_a_lock_survives_a_kill_and_is_written_by_the_next_start(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.start()
    marker = uuid.uuid4().hex
    answers: list[str] = []
    # Another connection that takes the database's write lock and keeps it, as a long `audit_prune` would.
    locker = sqlite3.connect(server.database.sqlite_path, timeout=10, isolation_level=None)

    async def call_while_locked() -> None:
        async with mcp_client(server.mcp_url, server.token) as client, anyio.create_task_group() as group:

            async def call() -> None:
                result = await client.call_tool("terminal_exec", {"command": f"sleep 2; echo {marker}"})
                answers.append(text_of(result))

            group.start_soon(call)
            await anyio.to_thread.run_sync(lambda: poll(lambda: rows_of_call(server, marker), 15, what="started"))
            locker.execute("BEGIN IMMEDIATE")  # before the command ends: its finished record meets the lock
            with anyio.fail_after(BUSY_TIMEOUT + 30):
                while not answers:
                    await anyio.sleep(0.1)

    try:
        began = time.monotonic()
        anyio.run(call_while_locked)
        assert answers == [f"stdout:\n{marker}\n\nexit_code: 0"]  # the result reached the client
        assert time.monotonic() - began >= BUSY_TIMEOUT  # after the writer gave up on the lock
        status, body = health(server)
        assert status == 503 and body["audit_records_held"]["count"] == 1  # type: ignore[index]
        assert "database is locked" in str(body["audit_records_held"])
        spill = server.state_dir / "audit_spill.jsonl"
        assert json.loads(spill.read_text())["outcome"] == "ok"
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)  # with the record still held
        server.process.wait()
    finally:
        if locker.in_transaction:
            locker.execute("ROLLBACK")
        locker.close()
    assert [row["kind"] for row in rows_of_call(server, marker)] == ["call.started"]
    server.start()
    try:
        rows = rows_of_call(server, marker)
        assert [row["kind"] for row in rows] == ["call.started", "call.finished"]
        assert (rows[1]["outcome"], rows[1]["exit_code"]) == ("ok", 0)
        assert marker in str(rows[1]["result_excerpt"])
        assert not (server.state_dir / "audit_spill.jsonl").exists()
        (event,) = server.database.query("SELECT detail FROM audit_auditrecord WHERE event = 'audit.records_held'")
        detail = json.loads(str(event["detail"]))
        assert (detail["count"], detail["replayed"], detail["reason"]) == (1, True, "database is locked")
        assert health(server)[0] == 200
        assert "OK" in server.manage("audit_verify").stdout
        log = server.log()
        assert "wrote 1 finished record(s) held in" in log
        assert log.count("Traceback") == 0
    finally:
        server.stop()


@pytest.fixture
def small_state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir on a 64 MiB tmpfs of its own, for a disk that fills up."""
    with small_tmpfs(tmp_path / "state", "64m") as mount:
        yield mount


def test_calls_running_when_the_disk_fills_keep_their_results_and_their_records(
    tmp_path: Path, small_state_dir: Path
) -> None:
    server = make_server(tmp_path / "server", SANDSTORM_STATE_DIR=str(small_state_dir))
    server.start()
    marker = uuid.uuid4().hex
    answers: list[str] = []
    filler: list[Path] = []

    async def calls_while_the_disk_fills() -> None:
        async with anyio.create_task_group() as group:
            for number in range(5):

                async def call(number: int = number) -> None:
                    async with mcp_client(server.mcp_url, server.token) as client:
                        command = f"sleep 2; echo {marker}-{number}"
                        answers.append(text_of(await client.call_tool("terminal_exec", {"command": command})))

                group.start_soon(call)
            await anyio.to_thread.run_sync(
                lambda: poll(lambda: len(rows_with(server, marker)) >= 5, 15, what="the calls to start")
            )
            filler.append(fill(small_state_dir))  # before the commands end: their finished records meet it

    try:
        anyio.run(calls_while_the_disk_fills)
        assert sorted(answers) == [f"stdout:\n{marker}-{number}\n\nexit_code: 0" for number in range(5)]
        filler[0].unlink()  # the admin makes room
        poll(lambda: health(server)[0] == 200, 30, what="the held records to be written")
        rows = rows_with(server, marker)
        assert sorted(str(row["kind"]) for row in rows) == ["call.finished"] * 5 + ["call.started"] * 5
        assert {row["outcome"] for row in rows if row["kind"] == "call.finished"} == {"ok"}
        assert "OK" in server.manage("audit_verify").stdout
        log = server.log()
        assert "Traceback" not in log
        # The first finished record met the full disk and was held (spilled into the ballast's room), then written.
        assert log.count("the database refused the finished record") == 1
        assert "held finished record(s) written" in log
    finally:
        if filler and filler[0].exists():
            filler[0].unlink()
        server.stop()


def rows_with(server: LiveServer, marker: str) -> list[dict[str, object]]:
    """Both records of every call whose command mentions `marker`."""
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    ids = [row["call_id"] for row in server.database.query(sql, f"%{marker}%")]
    rows: list[dict[str, object]] = []
    for call_id in ids:
        rows += [
            dict(row) for row in server.database.query("SELECT * FROM audit_auditrecord WHERE call_id=%s", call_id)
        ]
    return rows
