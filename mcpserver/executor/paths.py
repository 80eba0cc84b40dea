"""Workspace confinement: every path an agent names must resolve, symlinks followed, inside the root.

A path is checked once by name (`resolve`, which gives the real path results show) and then opened beneath a
descriptor of the root (`open`, `open_dir`, `make_dirs`; see beneath.py), so a link swapped in between cannot lead
out of the workspace. The file tools then act through those descriptors, never by name from the filesystem's root.
"""

from __future__ import annotations

import os
from pathlib import Path

from mcpserver.executor import beneath
from mcpserver.executor.interface import ToolFailure

SANDSTORM_DIR = ".sandstorm"
OUTPUT_SUBDIR = "output"


class Workspace:
    """The one tree the tools may touch. The root itself may be a symlink; it is resolved once."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(root))
        self._prefix = str(self.root).rstrip("/") + "/"  # string tests: pathlib's parents cost microseconds a call

    def resolve(self, path: str | None) -> Path:
        """The real path `path` names (absolute, or relative to the root), refusing anything outside the root.

        Symlinks are followed for every existing component, so a link inside the workspace that points out of it
        is refused; for a path that does not exist yet, its existing parent chain is resolved the same way.
        """
        if not path:
            return self.root
        if "\x00" in path:
            raise ToolFailure(f"Error: {path!r} contains a NUL byte")
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        try:
            real = Path(os.path.realpath(candidate))
        except OSError as error:  # a link that stopped being one between lstat and readlink: a race, refused
            raise ToolFailure(f"Error: {path}: changed while it was being resolved ({error.strerror})") from error
        if not self.contains(real):
            raise self._outside(path)
        return real

    def contains(self, real: Path) -> bool:
        return real == self.root or str(real).startswith(self._prefix)

    def _outside(self, path: object) -> ToolFailure:
        return ToolFailure(f"Error: {path} is outside the allowed directory {self.root}")

    def open(self, real: Path, flags: int, mode: int = 0o644) -> int:
        """A close-on-exec descriptor of `real` (a path `resolve` gave), opened beneath the root.

        A link that leads out of the root, swapped in since `resolve` looked, is refused as outside; other
        errors are the OSError of the open.
        """
        root = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return beneath.open_beneath(root, self._relative(real), flags, mode)
        except beneath.Escape as error:
            raise self._outside(real) from error
        finally:
            os.close(root)

    def open_dir(self, real: Path, flags: int = os.O_PATH) -> int:
        """A descriptor of the directory `real`, for `dir_fd=` (O_PATH) or, with O_RDONLY, for listing."""
        return self.open(real, flags | os.O_DIRECTORY)

    def make_dirs(self, real: Path) -> int:
        """Like `mkdir -p real`, one component at a time beneath the root; a descriptor (O_PATH) of the last.

        Raises FileExistsError when `real` itself is a file (as `mkdir -p` says), NotADirectoryError when a
        component before it is.
        """
        parts = self._relative(real).split("/") if real != self.root else []
        current = self.open_dir(self.root)
        try:
            for index, name in enumerate(parts):
                try:
                    os.mkdir(name, 0o777, dir_fd=current)  # never follows a link: one there makes it EEXIST
                    existed = None
                except FileExistsError as error:
                    existed = error
                try:
                    step = beneath.open_beneath(current, name, os.O_PATH | os.O_DIRECTORY)
                except NotADirectoryError:
                    if existed is not None and index == len(parts) - 1:
                        raise existed from None
                    raise
                except beneath.Escape as error:
                    raise self._outside(real) from error
                os.close(current)
                current = step
            result, current = current, -1
            return result
        finally:
            if current >= 0:
                os.close(current)

    def _relative(self, real: Path) -> str:
        if real == self.root:
            return ""
        text = str(real)
        if not text.startswith(self._prefix):  # only paths `resolve` gave come here
            raise self._outside(real)
        return text[len(self._prefix) :]

    def output_dir(self) -> Path:
        """`<root>/.sandstorm/output`, created with a .gitignore so `git add -A` never stages it."""
        base = self.root / SANDSTORM_DIR
        out = base / OUTPUT_SUBDIR
        out.mkdir(parents=True, exist_ok=True)
        ignore = base / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
        return out


def os_failure(path: object, exc: OSError) -> ToolFailure:
    """An OS error on `path` as the agent sees it: `Error: <path>: <what the OS said>`."""
    return ToolFailure(f"Error: {path}: {exc.strerror}")
