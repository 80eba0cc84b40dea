"""Reading a file a page at a time, within a byte budget, with notes saying how to read on.

Reads stream line by line and count lines in chunks, so a file of any size costs memory in proportion to the budget,
never to the file. With `numbered`, each line shown carries its line number as `cat -n` does, and the budget counts
those prefixes too.
"""

from __future__ import annotations

import codecs
import mimetypes
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace, os_failure
from mcpserver.executor.textsize import cut_to_json_size, json_size

BINARY_SNIFF_BYTES = 8192
COUNT_CHUNK = 1 << 20
NOTE_RESERVE = 512  # room kept for the note lines after a cut page; two notes with 20-digit numbers take < 400


@dataclass(frozen=True)
class _Line:
    text: str  # decoded; for a line longer than the budget, only its beginning
    size: int  # bytes of the whole line in the file, newline included
    whole: bool


def open_regular(workspace: Workspace, real: Path) -> BinaryIO:
    """Open `real` for reading; a directory or a non-regular file (a FIFO would block the thread forever) fails."""
    try:
        fd = workspace.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise os_failure(real, exc) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ToolFailure(f"Error: {real}: {'Is a directory' if stat.S_ISDIR(mode) else 'Not a regular file'}")
    return os.fdopen(fd, "rb")


def _skip_line(f: BinaryIO) -> int:
    """Move past the rest of the current line without holding it; the number of bytes skipped."""
    skipped = 0
    while chunk := f.read(COUNT_CHUNK):
        end = chunk.find(b"\n")
        if end >= 0:
            f.seek(end + 1 - len(chunk), os.SEEK_CUR)
            return skipped + end + 1
        skipped += len(chunk)
    return skipped


def _read_line(f: BinaryIO, cap: int) -> _Line | None:
    """The next line, holding at most `cap` + 1 bytes of it: a longer line cannot fit the budget anyway."""
    raw = f.readline(cap + 1)
    if not raw:
        return None
    if raw.endswith(b"\n") or len(raw) <= cap:
        return _Line(raw.decode("utf-8", errors="replace"), len(raw), True)
    # Decoding with final=False drops a character split by the cap instead of showing it as U+FFFD.
    text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw, final=False)
    return _Line(text, len(raw) + _skip_line(f), False)


def _seek_to_line(f: BinaryIO, first: int, size: int) -> bool:
    """Move to the start of line `first` (1-based), counting newlines in chunks; False if the file has no such line."""
    to_skip = first - 1
    while to_skip:
        chunk = f.read(COUNT_CHUNK)
        if not chunk:
            return False
        found = chunk.count(b"\n")
        if found < to_skip:
            to_skip -= found
            continue
        rest = chunk.split(b"\n", to_skip)[-1]
        f.seek(-len(rest), os.SEEK_CUR)
        break
    return first == 1 or f.tell() < size


def _count_rest(f: BinaryIO) -> tuple[int, int]:
    """Lines and bytes from the current position to the end; a last line without a newline counts."""
    lines = size = 0
    last = b"\n"
    while chunk := f.read(COUNT_CHUNK):
        lines += chunk.count(b"\n")
        size += len(chunk)
        last = chunk[-1:]
    return lines + (last != b"\n"), size


def _binary_note(f: BinaryIO, real: Path) -> str | None:
    head = f.read(BINARY_SNIFF_BYTES)
    f.seek(0)
    if b"\x00" not in head:
        return None
    kind = mimetypes.guess_type(real.name)[0] or "application/octet-stream"
    return f"Binary file {real}: {os.fstat(f.fileno()).st_size} bytes ({kind}); not shown as text"


def _number(line: int, numbered: bool) -> str:
    """The `cat -n` prefix of line `line`, or nothing."""
    return f"{line:>6}\t" if numbered else ""


def _collect(
    f: BinaryIO, first: int, limit: int | None, max_bytes: int, reserve: int, numbered: bool
) -> tuple[list[_Line], int, bool]:
    """Lines of the page while they fit `max_bytes`; how many fit with `reserve` kept for notes; True if overflowed."""
    lines: list[_Line] = []
    used = fitting = 0
    while limit is None or len(lines) < limit:
        line = _read_line(f, max_bytes)
        if line is None:
            break
        # Additive: JSON escapes each character on its own, so prefix and line can be sized apart.
        used += json_size(_number(first + len(lines), numbered)) + json_size(line.text)
        lines.append(line)
        if used > max_bytes or not line.whole:
            return lines, fitting, True
        if used <= max_bytes - reserve:
            fitting = len(lines)
    return lines, fitting, False


def _page(f: BinaryIO, first: int, limit: int | None, max_bytes: int, numbered: bool) -> str:
    """Lines from `first` (where `f` stands) within `max_bytes`, with a note saying how to read on when cut."""
    start, size = f.tell(), os.fstat(f.fileno()).st_size
    reserve = min(NOTE_RESERVE, max_bytes // 2)  # only a tiny (misconfigured) budget makes this smaller
    lines, fitting, overflowed = _collect(f, first, limit, max_bytes, reserve, numbered)
    texts = [_number(first + i, numbered) + line.text for i, line in enumerate(lines)]
    if not overflowed and f.tell() >= size:
        return "".join(texts)
    if not overflowed and fitting == len(lines):
        rest_lines, _ = _count_rest(f)
        last = first + len(lines) - 1
        total = last + rest_lines
        return _join(texts, [_page_note(first, last, total)])
    shown, notes = texts[:fitting], []
    if not fitting:  # the first line alone is over the budget: show its beginning rather than nothing
        prefix = _number(first, numbered)
        head = cut_to_json_size(lines[0].text, max_bytes - reserve - json_size(prefix))
        shown = [prefix + head]
        notes.append(
            f"[line {first} is {lines[0].size} bytes, over the budget: only its first "
            f"{len(head.encode('utf-8'))} bytes are shown]"
        )
        fitting = 1
    f.seek(start + sum(line.size for line in lines[:fitting]))
    rest_lines, rest_bytes = _count_rest(f)
    if rest_lines:
        notes.append(_continue_note(first + fitting, first + fitting - 1 + rest_lines, rest_bytes))
    return cut_to_json_size(_join(shown, notes), max_bytes)  # cuts only when the budget is absurdly small


def _join(texts: list[str], notes: list[str]) -> str:
    body = "".join(texts)
    if body and not body.endswith("\n"):
        body += "\n"
    return body + "\n".join(notes)


def _continue_note(next_line: int, total: int, remaining: int) -> str:
    return (
        f"[file continues: lines {next_line}-{total} ({remaining} bytes) not shown; "
        f"call file_read with offset={next_line} to read on]"
    )


def _page_note(first: int, last: int, total: int) -> str:
    return f"[lines {first}-{last} of {total}; call file_read with offset={last + 1} to read on]"


def check_page_args(offset: int | None, limit: int | None) -> None:
    if offset is not None and offset < 1:
        raise ToolFailure(f"Error: offset must be 1 or more (the first line is 1), not {offset}")
    if limit is not None and limit < 1:
        raise ToolFailure(f"Error: limit must be 1 or more (a number of lines), not {limit}")


def read_page(
    workspace: Workspace, path: str, first: int, limit: int | None, max_bytes: int, numbered: bool = False
) -> str:
    """Lines of the file at `path` from line `first` (1-based) within `max_bytes`, or a note on a binary file;
    `numbered`: each line prefixed with its number, right-aligned in 6 columns and a tab, as `cat -n` does."""
    real = workspace.resolve(path)
    with open_regular(workspace, real) as f:
        binary = _binary_note(f, real)
        if binary is not None:
            return binary
        if not _seek_to_line(f, first, os.fstat(f.fileno()).st_size):
            f.seek(0)
            raise ToolFailure(f"Error: {real} has only {_count_rest(f)[0]} lines")
        return _page(f, first, limit, max_bytes, numbered)
