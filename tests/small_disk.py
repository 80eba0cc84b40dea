"""A disk that fills up: a tmpfs of a given size mounted for one test (root only, as in CI), and filling it."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: "1m", "64m") at `mount`, made for the block; skips the test unless root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its disk is full; returns the file (removing it makes room again)."""
    filler = directory / "filler"
    # Unbuffered: a buffered writer keeps the bytes a short write left over and raises ENOSPC again on close.
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    assert os.statvfs(directory).f_bavail == 0
    return filler
