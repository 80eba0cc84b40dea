"""The file tools' OS work: read (paged to a byte budget), write, delete, list, move and mkdir, inside the workspace.

Reading is paging.py's, listing is listing.py's. Delete and move resolve only the parent of the path they act on and
keep its last component as written, so they act on a symlink itself, never on what it points to.

Every operation goes through descriptors opened beneath the workspace root (Workspace.open, see beneath.py): the
file itself, or the directory holding the name it acts on (`dir_fd=`), so a directory swapped for a symlink while
a tool runs cannot make it act outside the workspace.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
from pathlib import Path

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.listing import long_listing, tree_listing
from mcpserver.executor.paging import check_page_args, read_page
from mcpserver.executor.paths import Workspace, os_failure


class FileOps:
    """The file half of the executor; composed into LocalExecutor, which sets these attributes."""

    workspace: Workspace
    root: str
    env: dict[str, str]

    # --- read / write ------------------------------------------------------------------------------------------------

    async def read_file(
        self, path: str, offset: int | None, limit: int | None, max_bytes: int, line_numbers: bool = False
    ) -> str:
        check_page_args(offset, limit)
        return await asyncio.to_thread(read_page, self.workspace, path, offset or 1, limit, max_bytes, line_numbers)

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
            raise os_failure(real, exc) from exc
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
            raise os_failure(target, exc) from exc
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
            raise os_failure(src, exc) from exc
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
            raise os_failure(real, exc) from exc
        return f"Created directory {real}"

    # --- list --------------------------------------------------------------------------------------------------------

    async def list_dir(self, path: str, recursive: bool) -> str:
        real, directory = await asyncio.to_thread(self._listable, path)
        try:
            if recursive:
                return await asyncio.to_thread(tree_listing, real, directory)
            return await long_listing(real, directory, self.env)
        finally:
            os.close(directory)

    def _listable(self, path: str) -> tuple[Path, int]:
        """The real path and a readable descriptor of the directory `path` names."""
        real = self.workspace.resolve(path)
        try:
            return real, self.workspace.open_dir(real, os.O_RDONLY)
        except OSError as exc:  # ENOTDIR says "Not a directory"
            raise os_failure(real, exc) from exc


def _rename(src_dir: int, src_name: str, dest_dir: int, dest_name: str) -> None:
    """Rename a name in one open directory to a name in another; copy and remove across filesystems."""
    try:
        os.rename(src_name, dest_name, src_dir_fd=src_dir, dst_dir_fd=dest_dir)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # shutil works on paths: these reach the open directories themselves, never their names, through /proc.
        shutil.move(f"/proc/self/fd/{src_dir}/{src_name}", f"/proc/self/fd/{dest_dir}/{dest_name}")
