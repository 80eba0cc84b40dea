"""file_edit on a 10 MB text file, against the floor of plainly rewriting that file, and the executor's peak memory.

The floor is what any edit of the file must at least cost, measured on the same machine in the same run, in turn with
the calls: read the whole file (Path.read_bytes), write it to a temporary file in the same directory, fsync, rename
it over the original; plus one /health round trip for the HTTP hop. file_edit does that and also matches, diffs and
answers over MCP. The memory is the executor process's peak RSS growth (VmHWM after a reset, see bench/stats.py)
during one call, compared with the file's size: the file and its edited copy are both in memory, little more.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import psutil

from bench.client import HttpError, McpSession, result_text
from bench.quick_look import quick_look
from bench.sections import MB, SETTLE, Sizes, connection, in_turn
from bench.stats import peak_kb, ratio, reset_peak, summary
from tests.live import LiveServer

FILE_NAME = "bench-edit-10mb.txt"
LINES = 100_000  # of 100 bytes: 10 MB
MARKS = ("MARK-ALPHA", "MARK-OMEGA")  # the edited line says one, then the other: every call has one unique match
TARGET_TIME_RATIO = 2.0  # file_edit's median over the floor's
TARGET_MEMORY_RATIO = 3.0  # the executor's peak growth over the file's size


def write_file(path: Path) -> int:
    lines = [f"line {n:07d} ".ljust(99, "x") + "\n" for n in range(LINES)]
    lines[LINES // 2] = f"line {LINES // 2:07d} {MARKS[0]} ".ljust(99, "x") + "\n"
    data = "".join(lines).encode()
    path.write_bytes(data)
    return len(data)


def plain_rewrite(path: Path) -> None:
    """The floor's file half: the whole file read, written beside itself, made durable and renamed over it."""
    data = path.read_bytes()
    temp = path.with_name(f".{path.name}.floor")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def executor_pid(server: LiveServer) -> int | None:
    """The executor child of the server (`python -m mcpserver.executor`), else the server itself."""
    if server.process is None:
        return None
    try:
        for child in psutil.Process(server.process.pid).children(recursive=True):
            if "mcpserver.executor" in " ".join(child.cmdline()):
                return int(child.pid)
    except psutil.Error:
        pass
    return server.process.pid


async def measure(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    path = server.workspace / FILE_NAME
    size = write_file(path)
    http, session = connection(server), McpSession(connection(server), server.token)
    state = {"mark": 0}

    async def edit() -> dict[str, Any]:
        old, new = MARKS[state["mark"]], MARKS[1 - state["mark"]]
        result = await session.call("file_edit", {"path": FILE_NAME, "old_string": old, "new_string": new})
        if result.get("isError") or f"+line {LINES // 2:07d} {new}" not in result_text(result):
            raise AssertionError(f"file_edit answered {result_text(result)[:300]!r}")
        state["mark"] = 1 - state["mark"]
        return result

    async def floor() -> None:
        response = await http.request("GET", "/health", {})
        if response.status != 200:
            raise HttpError(f"http_{response.status}", "/health")
        await asyncio.to_thread(plain_rewrite, path)

    try:
        await session.start()
        return await _measured(server, size, edit, floor, sizes)
    finally:
        await session.close()
        await http.close()
        path.unlink(missing_ok=True)


async def _measured(server: LiveServer, size: int, edit: Any, floor: Any, sizes: Sizes) -> dict[str, Any]:
    runs = {"file_edit": edit, "floor": floor}
    durations: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        await run()  # warm: the page cache holds the file, the session is open
    pid = executor_pid(server)
    growth: list[float] = []
    for turn in range(max(sizes.big_repeats, 2) * 2):
        for name in in_turn(list(runs), turn):
            await asyncio.sleep(SETTLE)
            before = reset_peak(pid) if pid and name == "file_edit" else None
            began = time.perf_counter()
            await runs[name]()
            durations[name].append(time.perf_counter() - began)
            peak = peak_kb(pid) if before is not None and pid else None
            if before is not None and peak is not None:
                growth.append(max(0, peak - before) * 1024)
    edit_stats, floor_stats = summary(durations["file_edit"]), summary(durations["floor"])
    peak_growth = max(growth) if growth else None
    time_ratio = ratio(edit_stats["median_ms"], floor_stats["median_ms"])
    memory_ratio = round(peak_growth / size, 2) if peak_growth is not None else None
    return {
        "file_bytes": size,
        "file_edit": edit_stats,
        "floor": floor_stats,
        "time_ratio": time_ratio,
        "time_target": TARGET_TIME_RATIO,
        "time_met": time_ratio is not None and time_ratio <= TARGET_TIME_RATIO,
        "executor_peak_growth_mb": round(peak_growth / MB, 1) if peak_growth is not None else None,
        "memory_ratio": memory_ratio,
        "memory_target": TARGET_MEMORY_RATIO,
        "memory_met": memory_ratio is not None and memory_ratio < TARGET_MEMORY_RATIO,
    }


if __name__ == "__main__":  # a quick look by hand: python -m bench.toolkit_edit
    quick_look(measure)
