"""audit.sqlite_files reads a crashed SQLite database's WAL as SQLite's replay would: it names every damage that
would silently drop committed transactions (a flipped byte, a broken header, a WAL cut short or deleted), and keeps
quiet about what a crash leaves normally (an intact WAL, an unfinished transaction, frames of an older round)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from audit.sqlite_files import (
    FRAME_HEADER_BYTES,
    WAL_HEADER_BYTES,
    header_problem,
    in_use,
    read_wal,
    read_wal_index,
    wal_loss,
)

pytestmark = [pytest.mark.unit]
PAGE = 4096
# Writes ROWS committed rows (one transaction each), then, with OPEN, that many rows of a transaction that never
# commits (spilled into the WAL by a one-page cache), and ends without closing anything: a crash, as SIGKILL leaves it.
CRASH = """
import os, sqlite3, sys
path, rows, open_rows, restart = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")
if restart:  # everything so far into the database, and the next write starts the WAL over from its beginning
    db.execute("PRAGMA wal_checkpoint(RESTART)")
for n in range(rows):
    db.execute("INSERT INTO t (v) VALUES (?)", ("x" * 3000,))
if open_rows:
    db.execute("PRAGMA cache_size=1")
    db.execute("BEGIN")
    for n in range(open_rows):
        db.execute("INSERT INTO t (v) VALUES (?)", ("y" * 3000,))
os._exit(0)
"""


def crash(path: Path, rows: int, open_rows: int = 0, restart: bool = False) -> None:
    if not path.exists():  # the table made and the database closed cleanly first: a crash loses rows, not the table
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)")
    argv = [sys.executable, "-c", CRASH, str(path), str(rows), str(open_rows), "1" if restart else "0"]
    subprocess.run(argv, check=True, timeout=60)


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    """A database whose 30 committed rows are in its WAL only, with the wal-index a crashed process leaves."""
    database = tmp_path / "db.sqlite3"
    crash(database, 30)
    wal = read_wal(Path(f"{database}-wal").read_bytes(), PAGE)
    assert len(wal.frames) >= 30 and wal.replayed == len(wal.frames)  # the rows are in the WAL, not yet copied
    return database


def rows_sqlite_finds(database: Path) -> int:
    """What SQLite itself makes of the files: opened on copies, so the originals stay as they are."""
    copy = database.with_name("copy.sqlite3")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{database}{suffix}")
        if source.exists():
            Path(f"{copy}{suffix}").write_bytes(source.read_bytes())
    with contextlib.closing(sqlite3.connect(copy)) as db:
        count = db.execute("SELECT count(*) FROM t").fetchone()[0]
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)
    return int(count)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def frame_offset(number: int) -> int:
    return WAL_HEADER_BYTES + (number - 1) * (FRAME_HEADER_BYTES + PAGE)


def test_an_intact_wal_left_by_a_crash_loses_nothing(crashed: Path) -> None:
    assert wal_loss(crashed) is None
    assert rows_sqlite_finds(crashed) == 30


def test_a_flipped_byte_in_a_frame_drops_committed_rows_silently_and_is_named(crashed: Path) -> None:
    wal = Path(f"{crashed}-wal")
    flip(wal, frame_offset(10) + FRAME_HEADER_BYTES + 100)
    assert rows_sqlite_finds(crashed) < 30  # SQLite opens it without a word
    problem = wal_loss(crashed)
    assert problem is not None and "frame 10 of" in problem and "is damaged" in problem
    Path(f"{crashed}-shm").unlink()  # without the index, the intact commit frames after it still tell
    problem = wal_loss(crashed)
    assert problem is not None and "frame 10 of" in problem and "committed transactions after frame" in problem


def test_a_broken_wal_header_is_named(crashed: Path) -> None:
    flip(Path(f"{crashed}-wal"), 25)  # in the header's checksum
    assert rows_sqlite_finds(crashed) == 0
    assert "header of the write-ahead log" in (wal_loss(crashed) or "")
    Path(f"{crashed}-shm").unlink()
    assert "header of the write-ahead log" in (wal_loss(crashed) or "")


def test_a_wal_cut_short_is_named_against_its_index(crashed: Path) -> None:
    wal = Path(f"{crashed}-wal")
    os.truncate(wal, frame_offset(12))  # at a frame boundary: the WAL alone looks whole
    assert rows_sqlite_finds(crashed) < 30
    assert "it is cut short: 11 whole frames" in (wal_loss(crashed) or "")


def test_a_deleted_wal_is_named_against_its_index(crashed: Path) -> None:
    Path(f"{crashed}-wal").unlink()
    assert "is missing or empty, but its index" in (wal_loss(crashed) or "")


def test_an_unfinished_transaction_left_by_a_crash_is_no_loss(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    crash(database, 5, open_rows=40)
    wal = read_wal(Path(f"{database}-wal").read_bytes(), PAGE)
    assert len(wal.frames) > wal.replayed  # the open transaction's pages reached the WAL
    assert wal_loss(database) is None
    assert rows_sqlite_finds(database) == 5


def test_frames_of_an_earlier_round_after_a_restarted_wal_are_no_loss(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    crash(database, 30)
    crash(database, 3, restart=True)  # the WAL starts over: its tail holds the first round's frames
    wal = read_wal(Path(f"{database}-wal").read_bytes(), PAGE)
    assert len(wal.frames) > wal.replayed
    assert wal_loss(database) is None
    assert rows_sqlite_finds(database) == 33


def test_the_wal_index_is_read_only_when_whole(crashed: Path) -> None:
    shm = Path(f"{crashed}-shm").read_bytes()
    index = read_wal_index(shm)
    assert index is not None and index.frames == len(read_wal(Path(f"{crashed}-wal").read_bytes(), PAGE).frames)
    assert read_wal_index(shm[:50]) is None
    assert read_wal_index(shm[:20] + b"\xff" + shm[21:]) is None  # the two copies differ


def test_a_database_file_shorter_than_its_header_says_is_named(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    crash(database, 30)
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # a clean state: everything in the database file
    assert header_problem(database) is None
    os.truncate(database, database.stat().st_size // 2)
    assert "is cut short" in (header_problem(database) or "")
    database.write_bytes(b"\x00" * 4096)
    assert "is not an SQLite database" in (header_problem(database) or "")


def test_a_database_another_process_has_open_is_in_use(crashed: Path) -> None:
    assert not in_use(crashed)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys; d = sqlite3.connect(sys.argv[1]); d.execute('SELECT 1 FROM t');"
         " print('open', flush=True); sys.stdin.read()", str(crashed)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        assert in_use(crashed)
    finally:
        holder.kill()
        holder.wait()
    assert not in_use(crashed)
