"""A damaged database is never used silently (mcpserver.start_check): `make run` (`manage.py run`) and production's
`manage.py serve` refuse to start, in one line and with exit status 65, on a WAL whose replay would drop committed
records, on a database cut short, emptied or deleted where one was, and on a chain behind its anchor; they change
nothing then. `--accept-audit-loss` / SANDSTORM_ACCEPT_AUDIT_LOSS=1 starts anyway and records the loss. An undamaged
database starts as before: after a crash, after a clean stop, after a restore done as docs/operations.md says. And a
running server whose database cannot be read says so: /health 503, /mcp a JSON-RPC error, not an HTML page."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from audit.sqlite_files import FRAME_HEADER_BYTES, WAL_HEADER_BYTES, read_wal, read_wal_index
from tests.database import ON_POSTGRES, new_postgres_database, requires_sqlite
from tests.live import (
    INITIALIZE,
    MCP_HEADERS,
    REPO,
    START_DEADLINE,
    LiveServer,
    auth_headers,
    make_server,
    mcp_client,
    poll,
)
from tests.test_make_run_live import READY, stop

pytestmark = [pytest.mark.live, pytest.mark.slow]
EXIT_REFUSED = 65
PAGE = 4096
CALLS = 6


def call_tools(server: LiveServer, count: int = CALLS) -> None:
    async def calls() -> None:
        async with mcp_client(server.mcp_url, server.token) as client:
            for number in range(count):
                result = await client.call_tool("terminal_exec", {"command": f"echo call-{number}"})
                assert not result.is_error, result

    anyio.run(calls)


def served(root: Path, stop_with: signal.Signals) -> LiveServer:
    """A server that started, ran CALLS tool calls and was stopped with `stop_with` (SIGKILL: a crash)."""
    server = make_server(root)
    server.start()
    try:
        call_tools(server)
    finally:
        server.stop(stop_with)
    return server


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    """A server killed after its calls: their records are in the WAL only, which a start would replay."""
    server = served(tmp_path_factory.mktemp("crashed"), signal.SIGKILL)
    database = server.state_dir / "sandstorm.sqlite3"
    wal = read_wal(Path(f"{database}-wal").read_bytes(), PAGE)
    index = read_wal_index(Path(f"{database}-shm").read_bytes())
    assert wal.replayed == len(wal.frames) > 20 and len(wal.commits_after(0)) > 5, "the WAL holds committed frames"
    assert index is not None and index.frames == len(wal.frames) > index.backfilled, "not yet copied into the database"
    return server


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    """A server stopped cleanly after its calls: everything in the database file, the head anchored."""
    server = served(tmp_path_factory.mktemp("stopped"), signal.SIGTERM)
    assert not Path(f"{server.state_dir}/sandstorm.sqlite3-wal").exists()
    return server


def copy_of(template: LiveServer, root: Path, **overrides: str) -> LiveServer:
    """A server of its own on a copy of `template`'s state dir (the same token and admin password)."""
    server = make_server(
        root, SANDSTORM_MCP_TOKEN=template.token, SANDSTORM_ADMIN_PASSWORD=template.admin_password, **overrides
    )
    shutil.copytree(template.state_dir, server.state_dir)
    server.token, server.admin_password = template.token, template.admin_password
    return server


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` and the SHA-256 of its content."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def health_status(server: LiveServer) -> int | None:
    try:
        return httpx2.get(f"{server.url}/health", timeout=2).status_code
    except httpx2.TransportError:
        return None


def refused(server: LiveServer, *command: str) -> str:
    """Start `server` with manage.py `command` (run: what `make run` runs) and return the one line it refuses with;
    fail if it starts instead, says more, exits otherwise, or changes anything in the state dir."""
    before = snapshot(server.state_dir)
    process = subprocess.Popen(
        [sys.executable, "manage.py", *(command or ("run",))],
        cwd=REPO, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        started = poll(
            lambda: "exited" if process.poll() is not None else "started" if health_status(server) else None,
            2 * START_DEADLINE,
            what="the start to end",
        )
        assert started == "exited", "the server started on the damaged database"
    finally:
        if process.poll() is None:
            process.kill()
        assert process.stdout is not None
        lines = process.stdout.read().decode(errors="replace").strip().splitlines()
        process.stdout.close()
        process.wait()
    assert process.returncode == EXIT_REFUSED, "\n".join(lines)
    assert len(lines) == 1 and lines[0].startswith("sandstorm: not starting: "), "\n".join(lines)
    restore = "pg_dump" if ON_POSTGRES else "manage.py backup"
    assert restore in lines[0] and "--accept-audit-loss" in lines[0] and "Nothing was changed" in lines[0]
    assert snapshot(server.state_dir) == before, "the refused start changed the state dir"
    return lines[0]


@contextlib.contextmanager
def running(server: LiveServer, clean_exit: bool = True) -> Iterator[list[str]]:
    """`manage.py run` on `server`'s state dir, up until the block ends (then stopped with SIGTERM); yields the lines
    it wrote until it was ready. Its output goes to the server's log file: a pipe nobody reads would stall it."""
    earlier = len(server.log())  # what earlier runs in this test wrote

    def written() -> str:
        return server.log()[earlier:]

    with server.log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run"], cwd=REPO, env=server.env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        poll(lambda: process.poll() is not None or READY in written(), 2 * START_DEADLINE, what="the banner")
        assert process.poll() is None, written()
        assert health_status(server) == 200
        yield written().splitlines()
    finally:
        returncode = stop(process)
    assert returncode == 0 or not clean_exit, written()


def audit_verify(server: LiveServer) -> str:
    result = server.manage("audit_verify", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


# --- damage, made before the start ---------------------------------------------------------------------------------


def frame_offset(number: int) -> int:
    return WAL_HEADER_BYTES + (number - 1) * (FRAME_HEADER_BYTES + PAGE)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def middle_frame(wal_path: Path) -> int:
    """A frame in the middle of the WAL with committed transactions after it."""
    wal = read_wal(wal_path.read_bytes(), PAGE)
    number = len(wal.frames) // 2
    assert len(wal.commits_after(number)) >= 2
    return number


def flip_a_byte_in_a_frame(database: Path) -> None:
    wal = Path(f"{database}-wal")
    flip(wal, frame_offset(middle_frame(wal)) + FRAME_HEADER_BYTES + 1000)


def break_the_header(database: Path) -> None:
    flip(Path(f"{database}-wal"), 25)  # its checksum


def cut_the_wal_short(database: Path) -> None:
    wal = Path(f"{database}-wal")
    os.truncate(wal, frame_offset(middle_frame(wal)))


def delete_the_wal(database: Path) -> None:
    Path(f"{database}-wal").unlink()


def cut_the_database_to_zero_bytes(database: Path) -> None:
    os.truncate(database, 0)


WAL_DAMAGE: dict[str, Callable[[Path], None]] = {
    "a flipped byte in a frame": flip_a_byte_in_a_frame,
    "a broken header": break_the_header,
    "cut short": cut_the_wal_short,
    "deleted": delete_the_wal,
    "the database cut to 0 bytes": cut_the_database_to_zero_bytes,
}
WAL_LINES = {
    "a flipped byte in a frame": "sqlite3-wal is damaged (frame",
    "a broken header": "the header of the write-ahead log",
    "cut short": "is damaged (it is cut short",
    "deleted": "is missing or empty, but its index",
    "the database cut to 0 bytes": "sandstorm.sqlite3 is empty (0 bytes), but this state dir has history",
}


@requires_sqlite
@pytest.mark.parametrize("damage", list(WAL_DAMAGE))
def test_a_crashed_database_with_a_damaged_wal_refuses_the_start_in_one_line(
    crashed: LiveServer, tmp_path: Path, damage: str
) -> None:
    server = copy_of(crashed, tmp_path)
    WAL_DAMAGE[damage](server.state_dir / "sandstorm.sqlite3")
    line = refused(server)
    assert WAL_LINES[damage] in line, line


@requires_sqlite
def test_the_production_start_command_refuses_a_damaged_wal_too(crashed: LiveServer, tmp_path: Path) -> None:
    server = copy_of(crashed, tmp_path)
    flip_a_byte_in_a_frame(server.state_dir / "sandstorm.sqlite3")
    assert "sqlite3-wal is damaged" in refused(server, "serve")  # what sandstorm-mcp.service's ExecStart runs


def the_loss(server: LiveServer) -> tuple[int, dict[str, Any]]:
    """The id and detail of the one audit.loss_accepted event."""
    [loss] = server.database.query("SELECT id, detail FROM audit_auditrecord WHERE event = 'audit.loss_accepted'")
    return int(loss["id"]), json.loads(loss["detail"])


def anchored_head(server: LiveServer) -> int:
    return max(int(line.split()[2]) for line in (server.state_dir / "audit_anchors").read_text().splitlines())


@requires_sqlite
def test_a_database_cut_in_half_refuses_the_start_and_accepting_moves_it_aside(
    stopped: LiveServer, tmp_path: Path
) -> None:
    server = copy_of(stopped, tmp_path)
    database = server.state_dir / "sandstorm.sqlite3"
    os.truncate(database, database.stat().st_size // 2)
    half = database.read_bytes()
    assert "sandstorm.sqlite3 is cut short" in refused(server)
    assert "sandstorm.sqlite3 is cut short" in refused(server, "serve")
    anchored = anchored_head(server)
    accepted = server.manage("bootstrap", "--accept-audit-loss").stderr
    assert "damaged files kept as" in accepted, accepted
    [kept] = server.state_dir.glob("sandstorm.sqlite3.damaged-*")
    assert kept.read_bytes() == half
    loss_id, detail = the_loss(server)
    assert (detail["loss"], detail["chain_restarts_after"], detail["records_missing"]) == (
        "database_damaged",
        0,
        anchored,
    )
    assert loss_id == anchored + 1, "the new database gives out no id of a lost record"
    with running(server):
        call_tools(server, 1)
    assert "OK: " in audit_verify(server)


def test_a_deleted_database_in_a_state_dir_with_history_refuses_the_start_and_accepting_starts_anew(
    tmp_path: Path,
) -> None:
    """On SQLite the file is gone; on PostgreSQL the server is pointed at a new, empty database."""
    server = served(tmp_path / "server", signal.SIGTERM)
    if ON_POSTGRES:
        server.env["DATABASE_URL"] = new_postgres_database()
        assert "has no tables, but this state dir has history" in refused(server)
    else:
        (server.state_dir / "sandstorm.sqlite3").unlink()
        assert "sandstorm.sqlite3 is missing, but this state dir has history" in refused(server)
        assert not (server.state_dir / "sandstorm.sqlite3").exists()
    anchored = anchored_head(server)
    server.manage("bootstrap", "--accept-audit-loss")
    loss_id, detail = the_loss(server)
    assert detail["loss"] == "database_missing" and detail["records_missing"] == anchored
    assert loss_id == anchored + 1
    with running(server):
        call_tools(server, 1)
    assert "OK: " in audit_verify(server)


def cut_off_newest_records(server: LiveServer, keep: int) -> int:
    """Delete every audit record after `keep` and set the head back to it, as someone with write access to the
    database would (the shorter chain verifies on its own); returns the id of the newest record before."""
    database = server.database
    newest = database.query("SELECT last_record_id FROM audit_chainhead WHERE id = 1")[0]["last_record_id"]
    mac = database.query("SELECT mac FROM audit_auditrecord WHERE id = %s", keep)[0]["mac"]
    database.execute(
        ("DELETE FROM audit_auditrecord WHERE id > %s", [keep]),
        ("UPDATE audit_chainhead SET last_record_id = %s, mac = %s WHERE id = 1", [keep, mac]),
    )
    return int(newest)


def test_records_cut_off_the_chain_behind_its_anchor_refuse_the_start(tmp_path: Path) -> None:
    server = served(tmp_path / "server", signal.SIGTERM)  # the head anchored at the stop
    newest = cut_off_newest_records(server, keep=5)
    line = refused(server)
    assert f"the chain ends at record 5, but record {newest} was anchored" in line, line


@requires_sqlite
def test_accepting_a_damaged_wal_starts_records_the_loss_and_the_chain_verifies(
    crashed: LiveServer, tmp_path: Path
) -> None:
    server = copy_of(crashed, tmp_path, SANDSTORM_ACCEPT_AUDIT_LOSS="1")  # the way to pass it through `make run`
    state = server.state_dir
    flip_a_byte_in_a_frame(state / "sandstorm.sqlite3")
    damaged_wal = Path(f"{state}/sandstorm.sqlite3-wal").read_bytes()
    with running(server) as lines:
        accepted = next(line for line in lines if line.startswith("sandstorm: accepted the loss"))
        call_tools(server, 1)
    assert "recorded as audit record" in accepted and "the chain goes on after record" in accepted
    assert "audit_anchors" in audit_verify(server)  # the new anchor file, which the loss started
    [kept] = state.glob("sandstorm.sqlite3.damaged-*-wal")
    assert kept.read_bytes() == damaged_wal
    assert len(list(state.glob("audit_anchors.before-loss-*"))) == 1
    [loss] = server.database.query(
        "SELECT id, prev_mac, detail FROM audit_auditrecord WHERE event = 'audit.loss_accepted'"
    )
    detail = json.loads(loss["detail"])
    restarts_after = detail["chain_restarts_after"]
    assert detail["loss"] == "wal_damaged" and "frame" in detail["problem"] and loss["id"] == restarts_after + 1
    before = server.database.query("SELECT mac FROM audit_auditrecord WHERE id = %s", restarts_after)
    assert loss["prev_mac"] == before[0]["mac"], "the loss is chained on the last record kept"
    newer = server.database.query("SELECT id FROM audit_auditrecord WHERE id > %s", loss["id"])
    assert newer, "the call after the start was recorded after the loss"
    server.env.pop("SANDSTORM_ACCEPT_AUDIT_LOSS")
    with running(server):  # and the next start, without the flag, has nothing to say
        pass


def test_accepting_records_cut_off_the_chain_records_how_many_and_where_it_goes_on(tmp_path: Path) -> None:
    server = served(tmp_path / "server", signal.SIGTERM)
    newest = cut_off_newest_records(server, keep=5)
    accepted = server.manage("bootstrap", "--accept-audit-loss")  # production's way: sandstorm-manage bootstrap …
    assert f"record {newest} was anchored" in accepted.stderr and "the chain goes on after record 5" in accepted.stderr
    [loss] = server.database.query("SELECT id, detail FROM audit_auditrecord WHERE event = 'audit.loss_accepted'")
    detail = json.loads(loss["detail"])
    assert loss["id"] == newest + 1, "no lost id is given out again"
    assert (detail["records_missing"], detail["anchored_record_id"], detail["chain_restarts_after"]) == (
        newest - 5,
        newest,
        5,
    )
    with running(server):
        call_tools(server, 1)
    assert "OK: " in audit_verify(server)


@requires_sqlite
def test_a_crashed_database_with_an_intact_wal_starts(crashed: LiveServer, tmp_path: Path) -> None:
    server = copy_of(crashed, tmp_path)
    head = crashed_head(server)
    with running(server):
        call_tools(server, 1)
    assert int(server.database.query("SELECT last_record_id FROM audit_chainhead")[0]["last_record_id"]) > head
    audit_verify(server)


def crashed_head(server: LiveServer) -> int:
    """The chain head SQLite finds in the crashed copy (read on a copy of the copy: reading would checkpoint it)."""
    scratch = server.root / "scratch"
    shutil.copytree(server.state_dir, scratch)
    with contextlib.closing(sqlite3.connect(scratch / "sandstorm.sqlite3")) as database:
        head = int(database.execute("SELECT last_record_id FROM audit_chainhead").fetchone()[0])
    shutil.rmtree(scratch)
    assert head > 2 * CALLS
    return head


def test_a_cleanly_stopped_database_starts_again(tmp_path: Path) -> None:
    server = served(tmp_path / "server", signal.SIGTERM)
    with running(server):
        call_tools(server, 1)
    audit_verify(server)


@requires_sqlite
def test_a_backup_restored_as_documented_starts_and_verifies(tmp_path: Path) -> None:
    server = make_server(tmp_path / "server")
    backups = server.state_dir / "backups"
    with running(server):
        call_tools(server, 2)
        backups.mkdir()
        server.manage("backup", str(backups / "sandstorm-nightly.sqlite3"))
        call_tools(server, 2)  # records the backup does not have
    state, database = server.state_dir, server.state_dir / "sandstorm.sqlite3"
    # docs/operations.md, Backups and restore; first without moving the anchor file aside:
    for stale in (Path(f"{database}-wal"), Path(f"{database}-shm")):
        stale.unlink(missing_ok=True)
    shutil.copy(backups / "sandstorm-nightly.sqlite3", database)
    line = refused(server)
    assert "lost its newest records" in line and f"newest: {backups}/sandstorm-nightly.sqlite3" in line, line
    (state / "audit_anchors").rename(state / "audit_anchors.before-restore")
    with running(server):
        call_tools(server, 1)
    assert "OK: " in audit_verify(server)


# --- a database that cannot be read under a running server ----------------------------------------------------------


def overwrite_with_zeros(path: Path) -> None:
    """In place, as a failed disk would: the server's open descriptors and mappings see it at once."""
    with path.open("r+b") as file:
        file.write(bytes(path.stat().st_size))


@requires_sqlite
def test_a_database_that_cannot_be_read_is_a_503_on_health_and_a_json_rpc_error_at_mcp(tmp_path: Path) -> None:
    server = make_server(tmp_path / "server")
    with running(server, clean_exit=False):  # its shut-down cannot record its last records either
        call_tools(server, 2)
        token = server.create_token("never-used")  # looked up in the database at its first use
        for name in ("sandstorm.sqlite3", "sandstorm.sqlite3-wal", "sandstorm.sqlite3-shm"):
            overwrite_with_zeros(server.state_dir / name)

        def unhealthy() -> dict[str, Any] | None:
            answer = httpx2.get(f"{server.url}/health", timeout=30)
            return answer.json() if answer.status_code == 503 else None

        health = poll(unhealthy, START_DEADLINE, what="/health to answer 503")
        assert health["ok"] is False and health["database"]["ok"] is False
        assert "cannot be read" in health["database"]["error"]
        answer = httpx2.post(
            server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)}, timeout=10
        )
        assert answer.status_code == 503 and answer.headers["content-type"] == "application/json", answer.text[:300]
        assert answer.json()["jsonrpc"] == "2.0" and "cannot read its database" in answer.json()["error"]["message"]
