"""file_grep over a generated tree (20,000 files, 200 MB; --quick a tenth) against running rg on it directly.

The floor is what the call cannot avoid, measured in the same run, in turn with the calls: the same rg command line
run from the bench process in the same directory, plus one /health round trip for the HTTP hop. Two searches: the
files that match (every file holds a few matches) and matching lines with a head limit. The memory is the peak RSS
growth of the server and its executor during a call.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.client import HttpError, McpSession, result_text
from bench.quick_look import quick_look
from bench.sections import MB, SETTLE, Sizes, connection, in_turn
from bench.stats import peak_kb, ratio, reset_peak, summary
from bench.toolkit_edit import executor_pid
from mcpserver.executor import ripgrep
from tests.live import LiveServer

TREE = "bench-grep-tree"
FILE_BYTES = 10_000
FILES_PER_DIR = 100
TARGET_RATIO = 1.5
TARGET_MEMORY_MB = 50
SEARCHES: dict[str, dict[str, Any]] = {
    "files_with_matches": {"pattern": r"needle_\d+", "output_mode": "files_with_matches"},
    "content_head_100": {"pattern": r"needle_\d+", "output_mode": "content", "head_limit": 100},
}


def make_tree(root: Path, files: int) -> int:
    """`files` text files of FILE_BYTES in directories of FILES_PER_DIR; each holds two matching lines."""
    filler = ("lorem ipsum dolor sit amet consectetur " * 3)[:99] + "\n"
    total = 0
    for n in range(files):
        directory = root / f"d{n // FILES_PER_DIR:04d}"
        if n % FILES_PER_DIR == 0:
            directory.mkdir(parents=True, exist_ok=True)
        body = f"needle_{n} first\n" + filler * (FILE_BYTES // 100 - 2) + f"needle_{n} last\n"
        data = body.encode()[:FILE_BYTES]
        (directory / f"f{n:05d}.txt").write_bytes(data)
        total += len(data)
    return total


def direct_argv(search: dict[str, Any]) -> list[str]:
    rg = ripgrep.rg_binary()
    assert rg is not None, "rg is not installed"
    query = ripgrep.GrepQuery(search["pattern"], search["output_mode"])
    return ripgrep.grep_argv(rg, query, frozenset())


async def run_direct(argv: list[str], cwd: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    output, _ = await process.communicate()
    if process.returncode not in (0, 1) or not output:
        raise AssertionError(f"rg exited with {process.returncode}")


async def measure(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    files = 20_000 if sizes.huge_bytes >= 200 * MB else 2_000
    root = server.workspace / TREE
    began = time.perf_counter()
    tree_bytes = await asyncio.to_thread(make_tree, root, files)
    made_s = round(time.perf_counter() - began, 1)
    http, session = connection(server), McpSession(connection(server), server.token)
    try:
        await session.start()
        results = {name: await _search(server, http, session, root, search, sizes) for name, search in SEARCHES.items()}
    finally:
        await session.close()
        await http.close()
    return {"files": files, "tree_mb": round(tree_bytes / MB), "tree_made_s": made_s, "searches": results,
            "target_ratio": TARGET_RATIO, "target_memory_mb": TARGET_MEMORY_MB}  # fmt: skip


async def _search(
    server: LiveServer, http: Any, session: McpSession, root: Path, search: dict[str, Any], sizes: Sizes
) -> dict[str, Any]:
    argv = direct_argv(search)

    async def call() -> None:
        result = await session.call("file_grep", {**search, "path": TREE})
        if not result.get("structuredContent", {}).get("total"):
            raise AssertionError(f"file_grep answered {result_text(result)[:200]!r}")

    async def floor() -> None:
        response = await http.request("GET", "/health", {})
        if response.status != 200:
            raise HttpError(f"http_{response.status}", "/health")
        await run_direct(argv, root)

    runs = {"file_grep": call, "floor": floor}
    for run in runs.values():
        await run()  # warm: the page cache holds the tree
    pids = [pid for pid in {executor_pid(server), server.process.pid if server.process else None} if pid]
    durations: dict[str, list[float]] = {name: [] for name in runs}
    growth: list[float] = []
    for turn in range(max(sizes.big_repeats, 2) * 2):
        for name in in_turn(list(runs), turn):
            await asyncio.sleep(SETTLE)
            before = {pid: reset_peak(pid) for pid in pids} if name == "file_grep" else {}
            started = time.perf_counter()
            await runs[name]()
            durations[name].append(time.perf_counter() - started)
            grown = [(peak_kb(pid) or 0) - base for pid, base in before.items() if base is not None]
            if before and grown:
                growth.append(sum(max(0, kb) for kb in grown) * 1024)
    call_stats, floor_stats = summary(durations["file_grep"]), summary(durations["floor"])
    value = ratio(call_stats["median_ms"], floor_stats["median_ms"])
    peak_mb = round(max(growth) / MB, 1) if growth else None
    return {
        "file_grep": call_stats,
        "floor": floor_stats,
        "ratio": value,
        "ratio_met": value is not None and value <= TARGET_RATIO,
        "peak_growth_mb": peak_mb,
        "memory_met": peak_mb is not None and peak_mb < TARGET_MEMORY_MB,
    }


if __name__ == "__main__":  # a quick look by hand: python -m bench.toolkit_grep
    quick_look(measure)
