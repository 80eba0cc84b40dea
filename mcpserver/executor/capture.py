"""Bounded capture of a command's output: head and tail in memory, the whole stream spilled to a file.

A command may print far more than the server should hold (or send). Each stream keeps its first and last few
kilobytes in memory; once it outgrows that room, everything (what was buffered, then every later chunk) goes
to a file under the workspace's output directory, which the result names so the agent can page through it. The
directory has a size budget (savedoutput.py): a stream that meets it is saved in part or not at all, and its text
says so.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import BinaryIO

from mcpserver.executor.savedoutput import SavedOutput

logger = logging.getLogger(__name__)

SPILL_CAP = 256 * 1024 * 1024  # bytes per spill file; past it the file ends with a line saying it was cut


def spill_stem(label: str) -> str:
    """A fresh file-name stem such as `exec-20250101-120000-1a2b3c4d` for one run's output files."""
    return f"{label}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def trim_incomplete_end(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence cut short at its end (the rest of it was left out)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: keep looking for the lead byte
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return data[: len(data) - back] if needed > back else data
    return data


def trim_incomplete_start(data: bytes) -> bytes:
    """`data` without the continuation bytes of a UTF-8 sequence whose start was left out."""
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


class StreamCapture:
    """One stream (stdout or stderr): its head and tail in memory, its total size, and its spill file if any."""

    def __init__(self, name: str, budget: int, saved: SavedOutput, stem: str) -> None:
        self.name = name
        self.head_room = max(budget // 4, 0)
        self.tail_room = max(budget // 4, 0)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.path: Path | None = None
        self._saved = saved
        self._stem = stem
        self._file: BinaryIO | None = None
        self._spilled = 0
        self._spill_failed = False
        self.budget_full = False  # the saved-output budget ran out: the file holds only a part, or there is none

    def feed(self, data: bytes) -> None:
        if self._file is None and self.total + len(data) > self.head_room + self.tail_room:
            self._open_spill()
        self.total += len(data)
        self._write_spill(data)
        take = min(len(data), self.head_room - len(self.head))
        if take > 0:
            self.head += data[:take]
            data = data[take:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.tail_room
        if excess > 0:
            del self.tail[:excess]  # bytearray drops its front cheaply (no copy of the rest)

    def _open_spill(self) -> None:
        if self._spill_failed:
            return
        self._spill_failed = True  # opened once at most, whatever happens next
        pending = bytes(self.head) + bytes(self.tail)  # nothing was dropped yet
        if not self._saved.has_room():
            self.budget_full = True
            return
        target = self._saved.directory / f"{self._stem}.{self.name}.log"
        try:
            self._saved.create()
            # Unbuffered: what was granted is on disk at once, so measuring the directory meanwhile counts it.
            self._file = open(target, "xb", buffering=0)  # noqa: SIM115 - stays open while the command runs
        except OSError:
            logger.exception("cannot create the output file %s", target)
            return
        self.path = target
        self._write_spill(pending)

    def _write_spill(self, data: bytes) -> None:
        if self._file is None or self._spilled >= SPILL_CAP or self.budget_full or not data:
            return
        part = data[: SPILL_CAP - self._spilled]
        granted = self._saved.grant(len(part))
        try:
            self._file.write(part[:granted])
            self._spilled += granted
            if granted < len(part):
                self.budget_full = True
                self._file.write(
                    f"\n[output file cut at {self._spilled} bytes: the saved-output budget is full]\n".encode()
                )
            elif self._spilled >= SPILL_CAP:
                self._file.write(f"\n[output file cut at {SPILL_CAP} bytes; the command printed more]\n".encode())
        except OSError:
            logger.exception("cannot write the output file %s", self.path)
            self._spilled = SPILL_CAP  # stop trying; the file holds what it could

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                logger.exception("cannot close the output file %s", self.path)
            self._file = None

    @property
    def cut(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """The stream as text: whole if it fit, else head, a line saying what was left out and where, and tail."""
        if not self.cut:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        where = self._where()
        head = trim_incomplete_end(bytes(self.head)).decode("utf-8", errors="replace")
        tail = trim_incomplete_start(bytes(self.tail)).decode("utf-8", errors="replace")
        return f"{head}\n[... {omitted} bytes omitted; {where}]\n{tail}"

    def _where(self) -> str:
        if self.budget_full and self.path:
            return f"{self.path} holds only its first {self._spilled} bytes: {self._saved.full_message()}"
        if self.budget_full:
            return f"the whole {self.name} was not saved: {self._saved.full_message()}"
        return f"the whole {self.name} is in {self.path}" if self.path else f"the whole {self.name} was not saved"
