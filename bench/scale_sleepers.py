"""Section 8, figure 3: a quick call beside many sleeping ones (bench/scale.py says how)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from bench import sections
from bench.client import HttpError, McpSession, result_text
from bench.scale_sizes import ONE_SERVER, ScaleSizes
from bench.server import SERVER_SETTINGS, BenchServer, log, start_server
from bench.stats import summary

# The sleeping calls and the reader share the bench token: SERVER_SETTINGS gives it 200 call slots and 200 sessions,
# more than the 100 sleepers and the reader take.
SLEEP_SETTINGS = SERVER_SETTINGS
READ_PAUSE = 0.02  # seconds between two timed reads, alone and beside the sleepers alike
WINDOW_MARGIN = 0.25  # seconds before the first sleeper can end: the reads stop before any sleeper's answer


def sleepers_figure(scale: ScaleSizes, base: Path, root: Path) -> dict[str, Any]:
    server = start_server(root, base, SLEEP_SETTINGS)
    try:
        found = asyncio.run(reads_beside_sleepers(server, scale))
    finally:
        server.stop()
    log(
        f"bench: scale: file_read 1 KB alone {found['alone']['median_ms']} ms, beside {found['sleepers']} sleeping "
        f"calls {found['beside']['median_ms']} ms (difference {found['difference_ms']} ms); sleepers OK "
        f"{found['sleepers_ok']}"
    )
    return found


async def reads_beside_sleepers(server: BenchServer, scale: ScaleSizes) -> dict[str, Any]:
    sections.workspace_file(server, "bench-1kb.txt", 1024)
    reader = McpSession(sections.connection(server), server.token)
    sleepers = [McpSession(sections.connection(server), server.token) for _ in range(scale.sleepers)]
    try:
        await reader.start()
        read = functools.partial(reader.call, "file_read", {"path": "bench-1kb.txt"})
        await sections.timed(read, sections.BATCH)  # warm-up
        alone = await paced_reads(read, lambda count: count < scale.reads_alone)
        await asyncio.gather(*(session.start() for session in sleepers))
        sent = time.perf_counter()
        calls = [asyncio.create_task(sleep_call(session, scale.sleep_s)) for session in sleepers]
        window_end = sent + scale.sleep_s - WINDOW_MARGIN  # no sleeper, started after `sent`, has ended by then
        assert server.process is not None
        running = await sleeping_commands(server.process.pid, scale.sleep_s, scale.sleepers, window_end)

        def sleepers_run(_: int) -> bool:
            return time.perf_counter() < window_end and not any(call.done() for call in calls)

        beside = await paced_reads(read, sleepers_run)
        ended = await asyncio.gather(*calls)
    finally:
        for session in (reader, *sleepers):
            await session.close()
    return sleepers_summary(scale, alone, beside, running, ended)


def sleepers_summary(
    scale: ScaleSizes, alone: list[float], beside: list[float], running: int, ended: list[tuple[str, float]]
) -> dict[str, Any]:
    alone_stats, beside_stats = summary(alone), summary(beside)
    both = alone_stats["median_ms"] is not None and beside_stats["median_ms"] is not None
    outcomes = Counter(outcome for outcome, _ in ended)
    return {
        "sleepers": scale.sleepers,
        "sleep_s": scale.sleep_s,
        "running_when_sampled": running,
        "alone": alone_stats,
        "beside": beside_stats,
        "difference_ms": round(beside_stats["median_ms"] - alone_stats["median_ms"], 3) if both else None,
        "sleepers_ok": outcomes.pop("ok", 0),
        "sleeper_errors": dict(outcomes),
        "sleeper_call_s": summary([seconds for _, seconds in ended]),
        "server": ONE_SERVER,
    }


async def paced_reads(read: Callable[[], Awaitable[Any]], more: Callable[[int], bool]) -> list[float]:
    """Timed reads, READ_PAUSE apart, while `more(count so far)`: a probe, not a load of its own."""
    durations: list[float] = []
    while more(len(durations)):
        began = time.perf_counter()
        await read()
        durations.append(time.perf_counter() - began)
        await asyncio.sleep(READ_PAUSE)
    return durations


async def sleep_call(session: McpSession, seconds: int) -> tuple[str, float]:
    """`terminal_exec sleep N`: ("ok", its duration) if it ended as it should, else (what went wrong, duration)."""
    began = time.perf_counter()
    try:
        text = result_text(await session.call("terminal_exec", {"command": f"sleep {seconds}"}))
        outcome = "ok" if "exit_code: 0" in text else "unexpected_result"
    except HttpError as error:
        outcome = error.kind
    except (OSError, asyncio.IncompleteReadError) as error:
        outcome = type(error).__name__
    return outcome, time.perf_counter() - began


async def sleeping_commands(server_pid: int, seconds: int, expected: int, deadline: float) -> int:
    """Wait until `expected` `sleep N` commands run under the server (its executor's children), or the deadline;
    how many run. Polled before the timed reads start, never during them."""
    while True:
        running = count_sleeping(server_pid, seconds)
        if running >= expected or time.perf_counter() > deadline:
            return running
        await asyncio.sleep(0.05)


def count_sleeping(server_pid: int, seconds: int) -> int:
    try:
        descendants = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    count = 0
    for process in descendants:
        try:
            count += process.cmdline()[-2:] == ["sleep", str(seconds)]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended meanwhile, or not ours to read
    return count
