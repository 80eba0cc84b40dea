"""The executor hop: what running a tool's OS work in the executor process costs over doing it in-process.

Both paths run in the benchmark process, interleaved call by call so that the machine's noise falls on both: the
in-process executor (LocalExecutor) and the server's client to an executor child (RemoteExecutor over Unix
socket pairs handed to the child, connections kept between calls, as the server uses it).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.stats import summary
from mcpserver.executor.child import ExecutorChild
from mcpserver.executor.local import LocalExecutor

Operation = Callable[[Any], Awaitable[object]]
OPERATIONS: dict[str, Operation] = {
    "file_read_1kb": lambda executor: executor.read_file("hop-1kb.txt", None, None, 262144),
    "terminal_exec_true": lambda executor: executor.run_command("true", None, 30, 65536, None),
}


async def _timed(operation: Operation, executor: object) -> float:
    began = time.perf_counter()
    await operation(executor)
    return time.perf_counter() - began


async def executor_hop(calls: int, warmup: int) -> dict[str, Any]:
    """Per operation: the in-process and over-the-socket figures, and the hop (difference of the medians)."""
    with tempfile.TemporaryDirectory(prefix="sandstorm-bench-hop-") as workspace:
        (Path(workspace) / "hop-1kb.txt").write_text("x" * 1024)
        local = LocalExecutor(workspace)
        child = ExecutorChild(workspace)
        await asyncio.to_thread(child.start)
        remote = child.remote()
        results: dict[str, Any] = {}
        try:
            for name, operation in OPERATIONS.items():
                timings: dict[str, list[float]] = {"in_process": [], "executor": []}
                for index in range(warmup + calls):
                    in_process = await _timed(operation, local)
                    over_socket = await _timed(operation, remote)
                    if index >= warmup:
                        timings["in_process"].append(in_process)
                        timings["executor"].append(over_socket)
                local_summary, remote_summary = summary(timings["in_process"]), summary(timings["executor"])
                hop = round(remote_summary["median_ms"] - local_summary["median_ms"], 3)
                results[name] = {"in_process": local_summary, "executor": remote_summary, "hop_median_ms": hop}
        finally:
            await asyncio.to_thread(child.stop)
    return results
