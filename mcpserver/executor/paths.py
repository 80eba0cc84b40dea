"""Workspace confinement: every path an agent names must resolve, symlinks followed, inside the root."""

from __future__ import annotations

import os
from pathlib import Path

from mcpserver.executor.interface import ToolFailure

SANDSTORM_DIR = ".sandstorm"
OUTPUT_SUBDIR = "output"


class Workspace:
    """The one tree the tools may touch. The root itself may be a symlink; it is resolved once."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(root))

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
        real = Path(os.path.realpath(candidate))
        if not self.contains(real):
            raise ToolFailure(f"Error: {path} is outside the allowed directory {self.root}")
        return real

    def contains(self, real: Path) -> bool:
        return real == self.root or self.root in real.parents

    def output_dir(self) -> Path:
        """`<root>/.sandstorm/output`, created with a .gitignore so `git add -A` never stages it."""
        base = self.root / SANDSTORM_DIR
        out = base / OUTPUT_SUBDIR
        out.mkdir(parents=True, exist_ok=True)
        ignore = base / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
        return out
