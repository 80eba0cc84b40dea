"""file_grep's and file_glob's OS work: ripgrep run in the searched directory, its output paged to a byte budget.

The directory is opened beneath the workspace root first and rg starts in it through that descriptor
(`/proc/self/fd/N` as its working directory), so a directory swapped for a symlink after the path was checked
cannot send it elsewhere; inside, rg follows no symlink. Paths in results are relative to the searched directory.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from mcpserver.executor import ripgrep
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace, os_failure
from mcpserver.executor.processes import Collected, collect_output
from mcpserver.executor.textsize import json_size

SEARCH_TIMEOUT = 60.0
OUTPUT_CAP = 32 * 1024 * 1024  # rg's output kept for paging; past it the search is cut and the result says so
DEFAULT_HEAD_LIMIT = 250
GLOB_LIMIT = 100
NOT_INSTALLED = "Error: ripgrep (rg) is not installed: reinstall Sandstorm's Python dependencies (the ripgrep package)"


class SearchOps:
    """The search half of the executor; composed into LocalExecutor, which sets these attributes."""

    workspace: Workspace
    env: dict[str, str]
    _rg_types: frozenset[str] | None = None

    async def grep(
        self,
        pattern: str,
        path: str | None,
        glob: str | None,
        type: str | None,
        output_mode: str,
        case_insensitive: bool,
        line_numbers: bool,
        context_before: int | None,
        context_after: int | None,
        multiline: bool,
        head_limit: int | None,
        offset: int,
        max_bytes: int,
    ) -> dict[str, Any]:
        rg = _rg()
        query = ripgrep.GrepQuery(
            pattern, output_mode, glob, type, case_insensitive, line_numbers, context_before, context_after, multiline
        )
        known = await self._known_types(rg) if type is not None else frozenset()
        argv = ripgrep.grep_argv(rg, query, known)
        limit, start = _paging(head_limit, offset)
        collected, entries = await self._run_in(path, argv, newest_first=output_mode == "files_with_matches")
        if collected.returncode == 2 and (not entries or entries[0].startswith("rg: ")):
            raise ToolFailure("Error: " + "\n".join(entries[:20]).removeprefix("rg: "))
        matches = None
        if output_mode == "count":
            matches = sum(_count_of(entry) for entry in entries)
        return _page(entries, start, limit, max_bytes, collected.cut) | (
            {"matches": matches} if matches is not None else {}
        )

    async def glob_files(self, pattern: str, path: str | None, max_bytes: int) -> dict[str, Any]:
        rg = _rg()
        argv = ripgrep.glob_argv(rg, pattern)
        collected, files = await self._run_in(path, argv, newest_first=True)
        return _page(files, 0, GLOB_LIMIT, max_bytes, collected.cut)

    async def _known_types(self, rg: str) -> frozenset[str]:
        if self._rg_types is None:
            listed = await collect_output([rg, "--no-config", "--type-list"], env=self.env, timeout=10, cap=1 << 20)
            self._rg_types = ripgrep.type_names(listed.output.decode("utf-8", "replace"))
        return self._rg_types

    async def _run_in(self, path: str | None, argv: list[str], newest_first: bool) -> tuple[Collected, list[str]]:
        """Run `argv` in the directory `path` names, through a descriptor of it; its output lines, paths relative to
        that directory (`newest_first`: lines that are paths, sorted by modification time)."""
        real = self.workspace.resolve(path)
        try:
            fd = self.workspace.open_dir(real, os.O_RDONLY)
        except NotADirectoryError:
            raise ToolFailure(f"Error: {real}: Not a directory (search a directory, and narrow it with glob)") from None
        except OSError as exc:
            raise os_failure(real, exc) from exc
        try:
            collected = await collect_output(
                argv, env=self.env, timeout=SEARCH_TIMEOUT, cap=OUTPUT_CAP, pass_fds=(fd,), cwd=f"/proc/self/fd/{fd}"
            )
            lines = [ripgrep.relative(line) for line in _lines(collected)]
            if newest_first:
                lines = _newest_first(fd, lines)
        except FileNotFoundError as error:
            raise ToolFailure(NOT_INSTALLED) from error
        finally:
            os.close(fd)
        if collected.timed_out:
            raise ToolFailure(f"Error: the search took longer than {SEARCH_TIMEOUT:g}s: narrow it with path or glob")
        return collected, lines


def _rg() -> str:
    rg = ripgrep.rg_binary()
    if rg is None:
        raise ToolFailure(NOT_INSTALLED)
    return rg


def _paging(head_limit: int | None, offset: int) -> tuple[int, int]:
    if head_limit is not None and head_limit < 1:
        raise ToolFailure(f"Error: head_limit must be 1 or more, not {head_limit}")
    if offset < 0:
        raise ToolFailure(f"Error: offset must be 0 or more, not {offset}")
    return head_limit or DEFAULT_HEAD_LIMIT, offset


def _lines(collected: Collected) -> list[str]:
    text = collected.output.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if collected.cut and lines:
        lines.pop()  # cut mid-line
    return lines


def _count_of(entry: str) -> int:
    _, _, count = entry.rpartition(":")
    return int(count) if count.isdigit() else 0


def _newest_first(directory: int, names: list[str]) -> list[str]:
    """`names` (relative to the open `directory`) by modification time, newest first; the stat follows no link
    at the end (rg listed no path through one)."""

    def mtime(name: str) -> float:
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except OSError:
            return 0.0
        return info.st_mtime if stat.S_ISREG(info.st_mode) else 0.0

    return sorted(names, key=mtime, reverse=True)


def _page(entries: list[str], start: int, limit: int, max_bytes: int, cut: bool) -> dict[str, Any]:
    """Entries from `start`, at most `limit` of them and `max_bytes` of JSON text."""
    shown: list[str] = []
    used = 0
    for entry in entries[start : start + limit]:
        used += json_size(entry) + 2
        if used > max_bytes and shown:
            break
        shown.append(entry)
    end = start + len(shown)
    return {
        "entries": shown,
        "total": len(entries),
        "offset": start,
        "next_offset": end if end < len(entries) else None,
        "output_cut": cut,
    }
