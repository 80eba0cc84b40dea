"""A SQLite database's files read as SQLite would read them, before anything opens them: what opening would lose.

When the first connection opens a database in WAL mode, SQLite replays its write-ahead log (`<db>-wal`) and stops
at the first frame that is not intact (a header that does not check, a frame whose checksum or salts do not match):
everything after it is dropped without a word, committed transactions included, and the ids they used are given
out again. A WAL cut short, or deleted, loses its tail the same way. So the start-up check reads the files first:

- the WAL, frame by frame, with SQLite's own checksums (https://www.sqlite.org/fileformat.html#the_write_ahead_log):
  an intact commit frame after a broken one means committed transactions that the replay would drop;
- the wal-index (`<db>-shm`) a crashed process left: its header says how many frames the WAL held (`mxFrame`) and
  how many were already copied into the database (`nBackfill`); a WAL now shorter than that lost its tail;
- the database header: a file shorter than the page count its header gives was cut short.

Nothing here writes, locks for longer than a probe, or imports Django. A database another process has open (a
second server process on the same state dir) is not inspected: its WAL is live, not a crash's leftover.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

WAL_MAGIC = 0x377F0682  # | 1: checksums over big-endian words
WAL_VERSION = 3007000
WAL_HEADER_BYTES = 32
FRAME_HEADER_BYTES = 24
SHM_HEADER_BYTES = 48  # WalIndexHdr; two copies, then WalCkptInfo
SHM_DMS_BYTE = 128  # the "dead man switch": every connection holds a read lock on it while it has the file open
DATABASE_MAGIC = b"SQLite format 3\x00"
MASK = 0xFFFFFFFF


def _checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum (walChecksumBytes) over `data`, continued from (s0, s1)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for index in range(0, len(words), 2):
        s0 = (s0 + words[index] + s1) & MASK
        s1 = (s1 + words[index + 1] + s0) & MASK
    return s0, s1


def valid_page_size(size: int) -> bool:
    return 512 <= size <= 65536 and size & (size - 1) == 0


@dataclass(frozen=True)
class Frame:
    number: int  # 1-based, as SQLite counts them
    commit: bool  # the last frame of a transaction (its header gives the database size after it)
    intact: bool  # salts of this WAL's header, and its checksum, continued from the frame before's, matches


@dataclass(frozen=True)
class WalFile:
    header_ok: bool
    page_size: int
    frames: list[Frame]
    salts: bytes  # bytes 16-24 of the header, as the wal-index copies them

    @property
    def replayed(self) -> int:
        """How many frames SQLite's recovery keeps: up to the last commit before the first frame not intact."""
        kept = 0
        for frame in self.frames:
            if not frame.intact:
                break
            if frame.commit:
                kept = frame.number
        return kept if self.header_ok else 0

    @property
    def first_broken(self) -> int:
        """The number of the first frame that is not intact (one past the last frame if all are)."""
        return next((frame.number for frame in self.frames if not frame.intact), len(self.frames) + 1)

    def commits_after(self, number: int) -> list[Frame]:
        """Intact commit frames after frame `number` (each ends a transaction that was committed)."""
        return [frame for frame in self.frames if frame.number > number and frame.commit and frame.intact]


def read_wal(data: bytes, page_size_hint: int) -> WalFile:
    """The frames of a WAL file's content. Each frame's checksum is checked from the stored checksum of the frame
    before it, as SQLite chains them, so one damaged frame does not hide the intact ones after it."""
    magic, version, page_size = struct.unpack(">III", data[:12]) if len(data) >= 12 else (0, 0, 0)
    big_endian = bool(magic & 1)
    header_ok = (
        len(data) >= WAL_HEADER_BYTES
        and magic & ~1 == WAL_MAGIC
        and version == WAL_VERSION
        and valid_page_size(page_size)
        and _checksum(data[:24], big_endian) == struct.unpack(">II", data[24:32])
    )
    if not valid_page_size(page_size):
        page_size = page_size_hint
    salts = data[16:24]
    frames: list[Frame] = []
    size = FRAME_HEADER_BYTES + page_size
    previous = struct.unpack(">II", data[24:32]) if len(data) >= WAL_HEADER_BYTES else (0, 0)
    for number, offset in enumerate(range(WAL_HEADER_BYTES, len(data) - size + 1, size), start=1):
        header = data[offset : offset + FRAME_HEADER_BYTES]
        page, database_pages = struct.unpack(">II", header[:8])
        stored = struct.unpack(">II", header[16:24])
        # A frame with other salts is left from an earlier round of the WAL: not intact, and not worth a checksum.
        intact = header_ok and page != 0 and header[8:16] == salts
        if intact:
            seed = _checksum(header[:8], big_endian, *previous)
            intact = _checksum(data[offset + FRAME_HEADER_BYTES : offset + size], big_endian, *seed) == stored
        frames.append(Frame(number, database_pages != 0, intact))
        previous = stored
    return WalFile(header_ok, page_size, frames, salts)


@dataclass(frozen=True)
class WalIndex:
    frames: int  # mxFrame: frames of the WAL that the last writer had committed
    backfilled: int  # nBackfill: of those, the ones already copied into the database
    salts: bytes


def read_wal_index(data: bytes) -> WalIndex | None:
    """The wal-index header of a `-shm` file, or None if it is not a whole, initialised, checked one."""
    if len(data) < 2 * SHM_HEADER_BYTES + 4:
        return None
    first, second = data[:SHM_HEADER_BYTES], data[SHM_HEADER_BYTES : 2 * SHM_HEADER_BYTES]
    order = "<" if sys.byteorder == "little" else ">"  # the wal-index is in the host's byte order
    version, _, _, initialised = struct.unpack(f"{order}IIIB", first[:13])
    if first != second or version != WAL_VERSION or initialised != 1:
        return None
    if _checksum(first[:40], big_endian=order == ">") != struct.unpack(f"{order}II", first[40:48]):
        return None
    (frames,) = struct.unpack(f"{order}I", first[16:20])
    (backfilled,) = struct.unpack(f"{order}I", data[96:100])
    return WalIndex(frames, backfilled, first[32:40])


def in_use(database: Path) -> bool:
    """Whether another process has the database open: it holds a read lock on the wal-index's DMS byte.

    Probed with a non-blocking write lock on that byte, released at once (the file is closed, which drops every
    lock this process holds on it: call this before this process opens the database itself)."""
    try:
        descriptor = os.open(f"{database}-shm", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except PermissionError:
        return True  # not ours to inspect
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SHM_DMS_BYTE, os.SEEK_SET)
    except OSError:
        return True
    finally:
        os.close(descriptor)
    return False


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def database_page_size(database: Path) -> int:
    """The page size in the database's header (4096 if it cannot be read)."""
    try:
        with database.open("rb") as file:
            header = file.read(100)
    except OSError:
        return 4096
    if len(header) < 18:
        return 4096
    (size,) = struct.unpack(">H", header[16:18])
    size = 65536 if size == 1 else size
    return size if valid_page_size(size) else 4096


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def wal_loss(database: Path) -> str | None:
    """What opening `database` would drop of its WAL, in words, or None if the replay would keep every committed
    transaction (or there is no WAL)."""
    wal_path, shm_path = Path(f"{database}-wal"), Path(f"{database}-shm")
    index = read_wal_index(_read(shm_path))
    data = _read(wal_path)
    wal = read_wal(data, database_page_size(database))
    unsaved = index is not None and index.frames > index.backfilled  # frames the database does not have yet
    if not data:
        if unsaved:
            assert index is not None
            return (
                f"the write-ahead log {wal_path} is missing or empty, but its index {shm_path} says it held "
                f"{_plural(index.frames - index.backfilled, 'frame')} not yet copied into the database"
            )
        return None
    if not wal.header_ok:
        if unsaved or (index is None and wal.frames):
            return f"the header of the write-ahead log {wal_path} is broken: SQLite would ignore all of it"
        return None
    return _frames_lost(wal, index, wal_path, shm_path)


def _frames_lost(wal: WalFile, index: WalIndex | None, wal_path: Path, shm_path: Path) -> str | None:
    """What the replay of a WAL with an intact header would drop: frames its index says were committed, or intact
    commit frames after a damaged one."""
    replayed, whole = wal.replayed, len(wal.frames)
    current = index if index is not None and index.salts == wal.salts else None  # an index of this very WAL
    backfilled = current.backfilled if current is not None else 0
    if current is not None and current.frames > max(replayed, backfilled):
        if current.frames > whole:
            what = f"it is cut short: {whole} whole frames, but its index {shm_path} says it held {current.frames}"
        else:
            what = f"frame {wal.first_broken} of {current.frames} is damaged"
        return (
            f"the write-ahead log {wal_path} is damaged ({what}): SQLite would drop frames {replayed + 1} to "
            f"{current.frames}"
        )
    lost = [frame for frame in wal.commits_after(replayed) if frame.number > backfilled]
    if lost:
        return (
            f"the write-ahead log {wal_path} is damaged (frame {wal.first_broken} of {whole} is not intact): SQLite "
            f"would drop {_plural(len(lost), 'committed transaction')} after frame {replayed}"
        )
    return None


def header_problem(database: Path) -> str | None:
    """What is wrong with the database file on its own (read when no WAL holds newer pages): not an SQLite
    database, or shorter than its header says. None if neither."""
    size = database.stat().st_size
    with database.open("rb") as file:
        header = file.read(100)
    if header[:16] != DATABASE_MAGIC:
        return f"the database {database} is not an SQLite database (its header is damaged)"
    if len(header) < 100:
        return f"the database {database} is cut short ({size} bytes, less than its header)"
    change_counter, pages = struct.unpack(">II", header[24:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    page_size = database_page_size(database)
    if change_counter == valid_for and pages * page_size > size:
        return (
            f"the database {database} is cut short: {size} bytes, but its header says {pages} pages of {page_size} "
            f"bytes ({pages * page_size} bytes)"
        )
    return None
