"""file_edit's OS part: read a text file beneath the workspace root, then replace it atomically.

The file is opened through Workspace.open (see beneath.py), the same confinement file_write has; a symlink is
edited only when its target resolves inside the workspace, and then the target is what is rewritten. The new
content goes to a dot-prefixed temporary file created (O_EXCL) in the same directory, is fsynced and given the
original's mode and owner, and is renamed over it through the directory's descriptor: a reader sees the old file
or the new one, never half of either. Matching and the diff are edits.py's.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

from mcpserver.executor.edits import Edit, Piece, apply_edits, unified_diff
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace, os_failure
from mcpserver.executor.textsize import cut_to_json_size, json_size

MAX_EDIT_BYTES = 64 * 1024 * 1024
BINARY_PROBE = 8192  # a NUL byte in this much of the head means binary, as git and grep decide
READ_CHUNK = 1 << 16  # after the first read, of the size fstat gave: the file grew since
BOM = b"\xef\xbb\xbf"
TEMP_NAME_MAX = 200  # of the original's name kept in the temporary name (a name is at most 255 bytes)
TRUNCATED = "\n[diff cut to fit the result; file_read the file to see all of it]\n"


class EditOps:
    """The edit half of the executor; composed into LocalExecutor, which sets `workspace`."""

    workspace: Workspace

    async def edit_file(self, path: str, edits: list[dict[str, Any]], result_budget: int) -> dict[str, Any]:
        return await asyncio.to_thread(self._edit_file, path, _parsed(edits), result_budget)

    def _edit_file(self, path: str, edits: list[Edit], result_budget: int) -> dict[str, Any]:
        real = self.workspace.resolve(path)
        data, info = self._read(real)
        bom = data.startswith(BOM)
        before = data[len(BOM) :] if bom else data
        del data
        _check_text(before, real)
        applied = apply_edits(before, edits, str(real))
        diff = unified_diff(before, applied, str(real))
        del before
        self._replace(real, applied.pieces, info, BOM if bom else b"")
        shown = diff if json_size(diff) <= result_budget else _cut(diff, result_budget)
        return {"path": str(real), "diff": shown, "replacements": applied.replacements, "diff_truncated": shown != diff}

    def _read(self, real: Path) -> tuple[bytes, os.stat_result]:
        if real == self.workspace.root:
            raise ToolFailure(f"Error: {real}: Is a directory")
        try:
            # O_NOFOLLOW: resolve followed the links already; one swapped in since then is refused, not followed.
            # O_NONBLOCK: a FIFO fails the S_ISREG test below instead of blocking the thread until a writer comes.
            fd = self.workspace.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise os_failure(real, exc) from exc
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolFailure(f"Error: {real}: Is a directory")
            if not stat.S_ISREG(info.st_mode):
                raise ToolFailure(f"Error: {real}: Not a regular file, not edited")
            if info.st_size > MAX_EDIT_BYTES:
                raise ToolFailure(
                    f"Error: {real}: {info.st_size} bytes, over file_edit's limit of {MAX_EDIT_BYTES} bytes"
                )
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb", buffering=0) as file:
            data = _read_all(file, info.st_size + 1)
        if len(data) > MAX_EDIT_BYTES:
            raise ToolFailure(f"Error: {real}: grew past file_edit's limit of {MAX_EDIT_BYTES} bytes while read")
        if b"\x00" in data[:BINARY_PROBE]:
            raise ToolFailure(f"Error: {real}: binary file, not edited")
        return data, info

    def _replace(self, real: Path, pieces: tuple[Piece, ...], info: os.stat_result, bom: bytes) -> None:
        try:
            parent = self.workspace.open_dir(real.parent)
        except OSError as exc:
            raise os_failure(real.parent, exc) from exc
        kept = os.fsdecode(os.fsencode(real.name)[:TEMP_NAME_MAX])  # cut in bytes: the limit is 255 bytes, not chars
        temp = f".{kept}.{secrets.token_hex(6)}.edit"
        try:
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
            )
        except OSError as exc:
            os.close(parent)
            raise os_failure(real, exc) from exc
        try:
            _fill(fd, (bom, *pieces), info)
            os.rename(temp, real.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as exc:  # whatever went wrong (or a cancellation), no temporary file is left behind
            _discard(temp, parent)
            if isinstance(exc, OSError):
                raise os_failure(real, exc) from exc
            raise
        finally:
            os.close(parent)


def _parsed(edits: list[dict[str, Any]]) -> list[Edit]:
    try:
        return [Edit(str(e["old_string"]), str(e["new_string"]), bool(e.get("replace_all", False))) for e in edits]
    except (KeyError, TypeError) as exc:
        raise ToolFailure(f"Error: every edit needs old_string and new_string ({exc})") from exc


def _read_all(file: BinaryIO, first: int) -> bytes:
    """The file to its end (past MAX_EDIT_BYTES is not needed: a byte more says it is over), `first` bytes at once."""
    chunks, total = [], 0
    while total <= MAX_EDIT_BYTES:
        chunk = file.read(min(first if total == 0 else READ_CHUNK, MAX_EDIT_BYTES + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)  # one chunk, the usual case, is returned as it is


def _check_text(data: bytes, real: Path) -> None:
    if data.isascii():
        return  # most source files: checked without the copy a decode makes
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolFailure(f"Error: {real}: binary file (not valid UTF-8), not edited") from None


def _fill(fd: int, pieces: tuple[Piece, ...], info: os.stat_result) -> None:
    """Write the pieces to the temporary file (closing `fd`), make it durable, give it the original's mode and owner."""
    with os.fdopen(fd, "wb") as file:
        for piece in pieces:
            file.write(piece)
        file.flush()
        os.fchmod(fd, stat.S_IMODE(info.st_mode))
        try:
            os.fchown(fd, info.st_uid, info.st_gid)
        except PermissionError:
            pass  # not root and the file was someone else's: it becomes ours, as any editor's rewrite does
        os.fsync(fd)


def _discard(name: str, parent: int) -> None:
    try:
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        pass


def _cut(diff: str, budget: int) -> str:
    head = cut_to_json_size(diff, max(budget - json_size(TRUNCATED), 0))
    return head[: head.rfind("\n") + 1] + TRUNCATED.lstrip("\n")
