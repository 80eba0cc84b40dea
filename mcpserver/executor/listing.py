"""Listing a directory: `ls -la` of it, or its tree (sorted, relative paths, a few levels deep, links not followed)."""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Generator
from pathlib import Path

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import os_failure
from mcpserver.executor.processes import collect_output

LIST_MAX_DEPTH = 5
LIST_MAX_LINES = 500
LIST_SKIPPED = frozenset({".git", "node_modules"})
LS_TIMEOUT = 30.0
LS_OUTPUT_CAP = 4 << 20  # the result cap keeps far less; this only bounds memory for a huge directory
UNENTERABLE = frozenset({errno.EACCES, errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


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


def tree_listing(real: Path, directory: int) -> str:
    """The recursive listing of the directory open as `directory` (at `real`), cut at LIST_MAX_LINES."""
    tree = _tree(directory, "", 1)
    try:
        lines = list(itertools.islice(tree, LIST_MAX_LINES + 1))
    except OSError as exc:
        raise os_failure(real, exc) from exc
    finally:
        tree.close()  # closes the descriptors of the subdirectories it was in
    if not lines:
        return "(empty)"
    if len(lines) > LIST_MAX_LINES:
        return "\n".join(lines[:LIST_MAX_LINES] + [f"[listing cut at {LIST_MAX_LINES} lines]"])
    return "\n".join(lines)


async def long_listing(real: Path, directory: int, env: dict[str, str]) -> str:
    """`ls -la` of the directory open as `directory` (at `real`), run as the tools' commands are."""
    # ls gets the directory we opened, not its name: through /proc/self/fd, the name is never looked up again.
    argv = ["ls", "-la", "--color=never", "--", f"/proc/self/fd/{directory}/"]
    run = await collect_output(argv, env=env, timeout=LS_TIMEOUT, cap=LS_OUTPUT_CAP, pass_fds=(directory,))
    if run.timed_out:
        raise ToolFailure(f"Error: listing {real} took longer than {LS_TIMEOUT:.0f} s")
    text = run.output.decode("utf-8", errors="replace")
    if run.cut:
        return f"{text}\n[listing cut at {LS_OUTPUT_CAP} bytes]"
    if run.returncode != 0:
        raise ToolFailure(f"Error: {text.strip() or f'ls exited with status {run.returncode}'}")
    return text
