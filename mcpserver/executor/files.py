"""The file tools' OS work: read (paged to a byte budget), write, delete, list, move and mkdir, inside the workspace.

Reads stream line by line and count lines in chunks, so a file of any size costs memory in proportion to the budget,
never to the file. Delete and move resolve only the parent of the path they act on and keep its last component as
written, so they act on a symlink itself, never on what it points to.

Every operation goes through descriptors opened beneath the workspace root (Workspace.open, see beneath.py): the
file itself, or the directory holding the name it acts on (`dir_fd=`), so a directory swapped for a symlink while
a tool runs cannot make it act outside the workspace.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import itertools
import mimetypes
import os
import shutil
import stat
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import collect_output
from mcpserver.executor.textsize import cut_to_json_size, json_size

BINARY_SNIFF_BYTES = 8192
COUNT_CHUNK = 1 << 20
NOTE_RESERVE = 512  # room kept for the note lines after a cut page; two notes with 20-digit numbers take < 400
LIST_MAX_DEPTH = 5
LIST_MAX_LINES = 500
LIST_SKIPPED = frozenset({".git", "node_modules"})
LS_TIMEOUT = 30.0
LS_OUTPUT_CAP = 4 << 20  # the result cap keeps far less; this only bounds memory for a huge directory
UNENTERABLE = frozenset({errno.EACCES, errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def _failure(path: object, exc: OSError) -> ToolFailure:
    return ToolFailure(f"Error: {path}: {exc.strerror}")


# --- reading ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    text: str  # decoded; for a line longer than the budget, only its beginning
    size: int  # bytes of the whole line in the file, newline included
    whole: bool


def _open_regular(workspace: Workspace, real: Path) -> BinaryIO:
    """Open `real` for reading; a directory or a non-regular file (a FIFO would block the thread forever) fails."""
    try:
        fd = workspace.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise _failure(real, exc) from exc
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


def _collect(f: BinaryIO, limit: int | None, max_bytes: int, reserve: int) -> tuple[list[_Line], int, bool]:
    """Lines of the page while they fit `max_bytes`; how many fit with `reserve` kept for notes; True if overflowed."""
    lines: list[_Line] = []
    used = fitting = 0
    while limit is None or len(lines) < limit:
        line = _read_line(f, max_bytes)
        if line is None:
            break
        lines.append(line)
        used += json_size(line.text)  # additive: JSON escapes each character on its own
        if used > max_bytes or not line.whole:
            return lines, fitting, True
        if used <= max_bytes - reserve:
            fitting = len(lines)
    return lines, fitting, False


def _page(f: BinaryIO, first: int, limit: int | None, max_bytes: int) -> str:
    """Lines from `first` (where `f` stands) within `max_bytes`, with a note saying how to read on when cut."""
    start, size = f.tell(), os.fstat(f.fileno()).st_size
    reserve = min(NOTE_RESERVE, max_bytes // 2)  # only a tiny (misconfigured) budget makes this smaller
    lines, fitting, overflowed = _collect(f, limit, max_bytes, reserve)
    if not overflowed and f.tell() >= size:
        return "".join(line.text for line in lines)
    if not overflowed and fitting == len(lines):
        rest_lines, _ = _count_rest(f)
        last = first + len(lines) - 1
        total = last + rest_lines
        return _join([line.text for line in lines], [_page_note(first, last, total)])
    shown, notes = [line.text for line in lines[:fitting]], []
    if not fitting:  # the first line alone is over the budget: show its beginning rather than nothing
        shown = [cut_to_json_size(lines[0].text, max_bytes - reserve)]
        notes.append(f"[line {first} is {lines[0].size} bytes, over the budget: only its first "
                     f"{len(shown[0].encode('utf-8'))} bytes are shown]")
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
    return (f"[file continues: lines {next_line}-{total} ({remaining} bytes) not shown; "
            f"call file_read with offset={next_line} to read on]")


def _page_note(first: int, last: int, total: int) -> str:
    return f"[lines {first}-{last} of {total}; call file_read with offset={last + 1} to read on]"


def _check_page_args(offset: int | None, limit: int | None) -> None:
    if offset is not None and offset < 1:
        raise ToolFailure(f"Error: offset must be 1 or more (the first line is 1), not {offset}")
    if limit is not None and limit < 1:
        raise ToolFailure(f"Error: limit must be 1 or more (a number of lines), not {limit}")


# --- listing ---------------------------------------------------------------------------------------------------------


def _printable(name: str) -> str:
    """A file name as valid text: undecodable bytes (kept by os as surrogates) become U+FFFD."""
    return name.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _tree(directory: int, prefix: str, depth: int) -> Generator[str, None, None]:
    """Paths below the directory open as `directory` in sorted pre-order, directories with "/"; symlinks are listed,
    never followed (each subdirectory is opened with O_NOFOLLOW through its parent's descriptor)."""
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        is_dir = entry.is_dir(follow_symlinks=False)
        if is_dir and entry.name in LIST_SKIPPED:
            continue
        relative = prefix + _printable(entry.name)
        yield relative + "/" if is_dir else relative
        if is_dir and depth < LIST_MAX_DEPTH:
            try:
                sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except OSError as exc:
                if exc.errno not in UNENTERABLE:
                    raise
                continue  # unreadable, just removed, or swapped for a link: listed but not entered; the listing goes on
            try:
                yield from _tree(sub, relative + "/", depth + 1)
            finally:
                os.close(sub)


class FileOps:
    """The file half of the executor; composed into LocalExecutor, which sets these attributes."""

    workspace: Workspace
    root: str
    env: dict[str, str]

    # --- read / write ------------------------------------------------------------------------------------------------

    async def read_file(self, path: str, offset: int | None, limit: int | None, max_bytes: int) -> str:
        _check_page_args(offset, limit)
        return await asyncio.to_thread(self._read_file, path, offset or 1, limit, max_bytes)

    def _read_file(self, path: str, first: int, limit: int | None, max_bytes: int) -> str:
        real = self.workspace.resolve(path)
        with _open_regular(self.workspace, real) as f:
            binary = _binary_note(f, real)
            if binary is not None:
                return binary
            if not _seek_to_line(f, first, os.fstat(f.fileno()).st_size):
                f.seek(0)
                raise ToolFailure(f"Error: {real} has only {_count_rest(f)[0]} lines")
            return _page(f, first, limit, max_bytes)

    async def write_file(self, path: str, content: str) -> str:
        return await asyncio.to_thread(self._write_file, path, content)

    def _write_file(self, path: str, content: str) -> str:
        real = self.workspace.resolve(path)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate from a JSON "\ud800" escape
            raise ToolFailure(f"Error: content is not valid Unicode text ({exc.reason})") from exc
        if real == self.workspace.root:
            raise ToolFailure(f"Error: {real}: Is a directory")
        try:
            parent = self._parent_dir(real.parent)
            try:
                # O_NOFOLLOW: if the last component became a symlink since it was resolved, fail rather than follow it.
                # O_NONBLOCK: opening a FIFO fails at once instead of blocking the thread until a reader comes.
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(real.name, flags, 0o644, dir_fd=parent)
            finally:
                os.close(parent)
        except OSError as exc:
            raise _failure(real, exc) from exc
        with os.fdopen(fd, "wb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ToolFailure(f"Error: {real}: Not a regular file")
            f.write(data)
        return f"Written {len(content)} bytes to {real}"

    # --- delete / move / mkdir ---------------------------------------------------------------------------------------

    def _parent_dir(self, real: Path) -> int:
        """A descriptor of the directory `real`, created with its parents if missing (`mkdir -p`)."""
        try:
            return self.workspace.open_dir(real)
        except (FileNotFoundError, NotADirectoryError):
            return self.workspace.make_dirs(real)  # says FileExistsError for a file there, as mkdir -p does

    def _literal(self, path: str, verb: str) -> tuple[Path, str]:
        """`path`'s parent resolved (and confined) and its last component as written, so links are not followed."""
        trimmed = path.rstrip("/")
        name = os.path.basename(trimmed)
        if name in ("", ".", ".."):
            raise ToolFailure(f"Error: {path or '(empty path)'}: will not {verb} the workspace root or a '.'/'..' path")
        if "\x00" in name:
            raise ToolFailure(f"Error: {path!r} contains a NUL byte")
        if Path(os.path.normpath(self.workspace.root / trimmed)) == self.workspace.root:
            raise ToolFailure(f"Error: {self.workspace.root}: will not {verb} the workspace root")
        return self.workspace.resolve(os.path.dirname(trimmed)), name

    async def delete_file(self, path: str) -> str:
        return await asyncio.to_thread(self._delete_file, path)

    def _delete_file(self, path: str) -> str:
        parent_real, name = self._literal(path, "delete")
        target = parent_real / name
        try:
            parent = self.workspace.open_dir(parent_real)
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise ToolFailure(f"Error: {target}: Is a directory")
                os.unlink(name, dir_fd=parent)
            finally:
                os.close(parent)
        except FileNotFoundError:
            pass  # deleting what is not there succeeds, as the earlier server did
        except OSError as exc:
            raise _failure(target, exc) from exc
        return f"Deleted {target}"

    async def move(self, source: str, dest: str) -> str:
        return await asyncio.to_thread(self._move, source, dest)

    def _move(self, source: str, dest: str) -> str:
        src_real, src_name = self._literal(source, "move")
        src = src_real / src_name
        try:
            src_dir = self.workspace.open_dir(src_real)
        except OSError:
            raise ToolFailure(f"Error: {src}: No such file or directory") from None
        try:
            return self._move_from(src_dir, src, dest)
        finally:
            os.close(src_dir)

    def _move_from(self, src_dir: int, src: Path, dest: str) -> str:
        try:
            os.stat(src.name, dir_fd=src_dir, follow_symlinks=False)
        except OSError:
            raise ToolFailure(f"Error: {src}: No such file or directory") from None
        real_dest = self.workspace.resolve(dest)
        # Like mv: into an existing directory; otherwise onto the path itself, replacing a link there, not its target.
        try:
            dest_dir, target = self.workspace.open_dir(real_dest), real_dest / src.name
        except (FileNotFoundError, NotADirectoryError):
            parent_real, name = self._literal(dest, "replace")
            dest_dir, target = -1, parent_real / name
        try:
            if dest_dir < 0:
                dest_dir = self._parent_dir(target.parent)
            _rename(src_dir, src.name, dest_dir, target.name)
        except OSError as exc:
            raise _failure(src, exc) from exc
        finally:
            if dest_dir >= 0:
                os.close(dest_dir)
        return f"Moved {src} \u2192 {target}"

    async def mkdir(self, path: str) -> str:
        return await asyncio.to_thread(self._mkdir, path)

    def _mkdir(self, path: str) -> str:
        real = self.workspace.resolve(path)
        try:
            os.close(self.workspace.make_dirs(real))
        except OSError as exc:  # FileExistsError when a file has that name
            raise _failure(real, exc) from exc
        return f"Created directory {real}"

    # --- list --------------------------------------------------------------------------------------------------------

    async def list_dir(self, path: str, recursive: bool) -> str:
        real, directory = await asyncio.to_thread(self._listable, path)
        try:
            if recursive:
                return await asyncio.to_thread(self._list_tree, real, directory)
            return await self._ls(real, directory)
        finally:
            os.close(directory)

    def _listable(self, path: str) -> tuple[Path, int]:
        """The real path and a readable descriptor of the directory `path` names."""
        real = self.workspace.resolve(path)
        try:
            return real, self.workspace.open_dir(real, os.O_RDONLY)
        except OSError as exc:  # ENOTDIR says "Not a directory"
            raise _failure(real, exc) from exc

    def _list_tree(self, real: Path, directory: int) -> str:
        tree = _tree(directory, "", 1)
        try:
            lines = list(itertools.islice(tree, LIST_MAX_LINES + 1))
        except OSError as exc:
            raise _failure(real, exc) from exc
        finally:
            tree.close()  # closes the descriptors of the subdirectories it was in
        if not lines:
            return "(empty)"
        if len(lines) > LIST_MAX_LINES:
            return "\n".join(lines[:LIST_MAX_LINES] + [f"[listing cut at {LIST_MAX_LINES} lines]"])
        return "\n".join(lines)

    async def _ls(self, real: Path, directory: int) -> str:
        # ls gets the directory we opened, not its name: through /proc/self/fd, the name is never looked up again.
        argv = ["ls", "-la", "--color=never", "--", f"/proc/self/fd/{directory}/"]
        run = await collect_output(argv, env=self.env, timeout=LS_TIMEOUT, cap=LS_OUTPUT_CAP, pass_fds=(directory,))
        if run.timed_out:
            raise ToolFailure(f"Error: listing {real} took longer than {LS_TIMEOUT:.0f} s")
        text = run.output.decode("utf-8", errors="replace")
        if run.cut:
            return f"{text}\n[listing cut at {LS_OUTPUT_CAP} bytes]"
        if run.returncode != 0:
            raise ToolFailure(f"Error: {text.strip() or f'ls exited with status {run.returncode}'}")
        return text


def _rename(src_dir: int, src_name: str, dest_dir: int, dest_name: str) -> None:
    """Rename a name in one open directory to a name in another; copy and remove across filesystems."""
    try:
        os.rename(src_name, dest_name, src_dir_fd=src_dir, dst_dir_fd=dest_dir)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # shutil works on paths: these reach the open directories themselves, never their names, through /proc.
        shutil.move(f"/proc/self/fd/{src_dir}/{src_name}", f"/proc/self/fd/{dest_dir}/{dest_name}")
