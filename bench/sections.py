"""The measurements of sections 1 to 5 (section 6 is bench/audit_admin.py), one coroutine per section of the table,
and what they share. Each returns plain JSON-ready data."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.client import Connection, HttpError, McpSession, result_text
from bench.server import BenchServer
from bench.stats import peak_kb, reset_peak, summary
from tests.live import LiveServer

MB = 1_000_000
T = TypeVar("T")
TRUE = {"command": "true"}


@dataclass(frozen=True)
class Sizes:
    """How much work each section does: the full run, or --quick."""

    sequential: int = 300
    warmup: int = 20
    big_repeats: int = 5
    huge_bytes: int = 200 * MB
    huge_repeats: int = 3
    clients: int = 50
    calls_per_client: int = 20
    page_loads: int = 10
    older_page: int = 50

    @classmethod
    def quick(cls) -> Sizes:
        return cls(sequential=40, warmup=5, big_repeats=2, huge_bytes=50 * MB, huge_repeats=1, clients=10,
                   calls_per_client=5, page_loads=3, older_page=10)  # fmt: skip


def connection(server: LiveServer) -> Connection:
    return Connection("127.0.0.1", server.port)


def in_turn(labels: list[T], turn: int) -> list[T]:
    """The labels, rotated by `turn`: over the turns, each takes every place in the order."""
    shift = turn % len(labels) if labels else 0
    return labels[shift:] + labels[:shift]


async def timed(fn: Any, count: int) -> list[float]:
    durations = []
    for _ in range(count):
        began = time.perf_counter()
        await fn()
        durations.append(time.perf_counter() - began)
    return durations


# --- 1 to 3. the floors and the sequential calls, in alternating batches ------------------------------------------

BATCH = 20  # calls of one kind in a row, before the next kind's turn
SETTLE = 0.05  # seconds between turns: whatever the server still does after a batch does not fall on the next one


async def timed_in_turns(runs: dict[str, Any], sizes: Sizes) -> dict[str, list[float]]:
    """Each of `runs` (a coroutine function per label) warmed up, then `sizes.sequential` calls of each, BATCH at a
    time in turns, the order rotating round after round: every label's figure spans the same stretch of the run."""
    durations: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        await timed(run, sizes.warmup)
    names = list(runs)
    for turn in range(-(-sizes.sequential // BATCH)):
        count = min(BATCH, sizes.sequential - turn * BATCH)
        for name in in_turn(names, turn):
            await asyncio.sleep(SETTLE)
            durations[name] += await timed(runs[name], count)
    return durations


async def spawn_bash() -> None:
    process = await asyncio.create_subprocess_exec("/bin/bash", "-c", "true")
    await process.wait()


async def floors_and_calls(server: LiveServer, sizes: Sizes) -> dict[str, dict[str, Any]]:
    """The two floors and the two kinds of sequential call, BATCH at a time, round after round in turn.

    On a shared machine the speed of everything changes from one second to the next; measured one after another,
    a few seconds apart, a floor and the calls it is compared with could land in different spells. In turns, every
    figure is taken across the same stretch of the run.
    """
    return (await floors_and_calls_of({"": server}, sizes))[""]


async def floors_and_calls_of(servers: dict[str, LiveServer], sizes: Sizes) -> dict[str, dict[str, dict[str, Any]]]:
    """floors_and_calls for several servers at once (--compare), every kind of every server in the same turns."""
    http = {label: connection(server) for label, server in servers.items()}
    calls = {
        "terminal_exec_true": ("terminal_exec", TRUE, "exit_code: 0"),
        "file_read_1kb": ("file_read", {"path": "bench-1kb.txt"}, "xxxx"),
    }
    sessions = {
        (label, name): McpSession(connection(server), server.token)
        for label, server in servers.items()
        for name in calls
    }

    def get_health(label: str) -> Any:
        async def get() -> None:
            response = await http[label].request("GET", "/health", {})
            if response.status != 200:
                raise HttpError(f"http_{response.status}", "/health")

        return get

    try:
        measured: dict[tuple[str, str], Any] = {}
        for label, server in servers.items():
            workspace_file(server, "bench-1kb.txt", 1024)
            measured[label, "spawn_bash"] = spawn_bash
            measured[label, "health"] = get_health(label)
            for name, (tool, arguments, expect) in calls.items():
                session = sessions[label, name]
                await session.start()
                first = result_text(await session.call(tool, arguments))
                if expect not in first:
                    raise AssertionError(f"{tool} answered {first[:200]!r}")
                measured[label, name] = functools.partial(session.call, tool, arguments)
        kinds = ("spawn_bash", "health", *calls)
        keys = [(label, kind) for kind in kinds for label in servers]  # (old, spawn), (new, spawn), (old, health)...
        durations: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        for run in measured.values():
            await timed(run, sizes.warmup)
        for turn in range(-(-sizes.sequential // BATCH)):
            count = min(BATCH, sizes.sequential - turn * BATCH)
            for key in in_turn(keys, turn):
                await asyncio.sleep(SETTLE)
                durations[key] += await timed(measured[key], count)
        return {label: {kind: summary(durations[label, kind]) for kind in kinds} for label in servers}
    finally:
        for client in http.values():
            await client.close()
        for session in sessions.values():
            await session.close()


# --- 4. large results: throughput and the server's peak memory ----------------------------------------------------


async def large_result(
    servers: dict[str, LiveServer], tool: str, arguments: dict[str, Any], payload: int, repeats: int
) -> dict[str, dict[str, Any]]:
    """One large call at a time, server after server in turn (one server but for --compare)."""
    sessions = {label: McpSession(connection(server), server.token) for label, server in servers.items()}
    durations: dict[str, list[float]] = {label: [] for label in servers}
    growth: dict[str, list[float]] = {label: [] for label in servers}
    result_bytes = dict.fromkeys(servers, 0)
    try:
        for session in sessions.values():
            await session.start()
        for repeat in range(repeats):
            for label in in_turn(list(servers), repeat):
                process = servers[label].process
                pid = process.pid if process else 0
                before = reset_peak(pid)
                began = time.perf_counter()
                result = await sessions[label].call(tool, arguments)
                durations[label].append(time.perf_counter() - began)
                peak = peak_kb(pid)
                if before is not None and peak is not None:
                    growth[label].append(max(0, peak - before) / 1024)
                result_bytes[label] = len(result_text(result).encode())
    finally:
        for session in sessions.values():
            await session.close()
    return {label: _large_summary(durations[label], growth[label], payload, result_bytes[label]) for label in servers}


def _large_summary(durations: list[float], growth: list[float], payload: int, result_bytes: int) -> dict[str, Any]:
    stats = summary(durations)
    return {
        **stats,
        "payload_bytes": payload,
        "result_bytes": result_bytes,
        "mb_per_s": round(payload / MB / (stats["median_ms"] / 1000), 1),
        "peak_growth_mb": round(max(growth), 1) if growth else None,
    }


async def throughput(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    return (await throughput_of({"": server}, sizes))[""]


async def throughput_of(servers: dict[str, LiveServer], sizes: Sizes) -> dict[str, dict[str, Any]]:
    for server in servers.values():
        (server.workspace / "bench-10mb.txt").write_text(("a" * 99 + "\n") * (10 * MB // 100))
    print_10mb = {"command": f"head -c {10 * MB} /dev/zero | tr '\\0' a"}
    print_huge = {"command": f"head -c {sizes.huge_bytes} /dev/zero | tr '\\0' a"}
    cases = {
        "file_read_10mb": await large_result(
            servers, "file_read", {"path": "bench-10mb.txt"}, 10 * MB, sizes.big_repeats
        ),
        "terminal_exec_10mb": await large_result(servers, "terminal_exec", print_10mb, 10 * MB, sizes.big_repeats),
        "terminal_exec_huge": await large_result(
            servers, "terminal_exec", print_huge, sizes.huge_bytes, sizes.huge_repeats
        ),
    }
    return {label: {name: case[label] for name, case in cases.items()} for label in servers}


# --- 5. concurrent clients ------------------------------------------------------------------------------------------


async def _client(
    server: LiveServer,
    calls: int,
    start: asyncio.Event,
    errors: Counter[str],
    durations: list[float],
    sessions: list[str],
) -> int:
    session = McpSession(connection(server), server.token)
    done = 0
    try:
        await session.start()
        sessions.append(session.session_id)
        await start.wait()
        for _ in range(calls):
            began = time.perf_counter()
            try:
                await session.call("terminal_exec", TRUE)
                durations.append(time.perf_counter() - began)
                done += 1
            except HttpError as error:
                errors[error.kind] += 1
            except (OSError, asyncio.IncompleteReadError) as error:
                errors[type(error).__name__] += 1
                await session.connection.close()
    except (HttpError, OSError, asyncio.IncompleteReadError) as error:
        errors[f"session_{getattr(error, 'kind', type(error).__name__)}"] += 1
    finally:
        await session.close()
    return done


async def concurrency(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    load = await _load(server, sizes)
    del load["latency_s"]
    return load


async def _load(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    """`sizes.clients` clients at once, each making its calls; the raw latencies too ("latency_s")."""
    errors: Counter[str] = Counter()
    durations: list[float] = []
    sessions: list[str] = []
    start = asyncio.Event()
    tasks = [
        asyncio.create_task(_client(server, sizes.calls_per_client, start, errors, durations, sessions))
        for _ in range(sizes.clients)
    ]
    while len(sessions) + sum(errors.values()) < sizes.clients and not all(task.done() for task in tasks):
        await asyncio.sleep(0.01)  # every client has its session before the clock starts
    began = time.perf_counter()
    start.set()
    done = sum(await asyncio.gather(*tasks))
    elapsed = time.perf_counter() - began
    return {
        "clients": sizes.clients,
        "calls_per_client": sizes.calls_per_client,
        "calls": done,
        "seconds": round(elapsed, 3),
        "calls_per_s": round(done / elapsed, 1),
        "latency": summary(durations),
        "latency_s": durations,
        "errors": dict(errors),
        "sessions": sessions,
    }


async def concurrency_of(servers: dict[str, LiveServer], sizes: Sizes, rounds: int) -> dict[str, dict[str, Any]]:
    """The load `rounds` times on each server, server after server in turn; each server's loads added up."""
    loads: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
    for turn in range(rounds):
        for label in in_turn(list(servers), turn):
            loads[label].append(await _load(servers[label], sizes))
    return {label: _added(runs) for label, runs in loads.items()}


def _added(runs: list[dict[str, Any]]) -> dict[str, Any]:
    calls, seconds = sum(run["calls"] for run in runs), sum(run["seconds"] for run in runs)
    errors: Counter[str] = Counter()
    for run in runs:
        errors.update(run["errors"])
    return {
        **{key: runs[0][key] for key in ("clients", "calls_per_client")},
        "rounds": len(runs),
        "calls": calls,
        "seconds": round(seconds, 3),
        "calls_per_s": round(calls / seconds, 1),
        "latency": summary([value for run in runs for value in run["latency_s"]]),
        "errors": dict(errors),
        "sessions": [session for run in runs for session in run["sessions"]],
    }


def audit_check(server: BenchServer, sessions: list[str], calls_per_session: int) -> dict[str, Any]:
    """Exactly one started and one finished record per call in every session, an intact chain, no lock errors."""
    checked = subprocess.run(
        [sys.executable, "-m", "bench.dbtask", "audit-check", *sessions],
        cwd=server.tree, env=server.env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    found = json.loads(checked.stdout)
    expected = {"call.started": calls_per_session, "call.finished": calls_per_session}
    counts: dict[str, dict[str, int]] = found["counts"]
    return {
        "records": sum(sum(kinds.values()) for kinds in counts.values()),
        "records_expected": 2 * calls_per_session * len(sessions),
        "sessions_with_wrong_counts": sum(1 for kinds in counts.values() if kinds != expected),
        "chain_intact": found["verify_ok"] and found["verify"].startswith("OK"),
        "audit_verify": found["verify"][-300:],
        "database_locked_in_log": server.log().count("database is locked"),
    }


def wait_quiet(seconds: float = 0.5) -> None:
    """A short pause between sections so one section's stragglers (reaped processes, log writes) settle."""
    time.sleep(seconds)


def workspace_file(server: LiveServer, name: str, size: int) -> Path:
    path = server.workspace / name
    path.write_text(("x" * 63 + "\n") * (size // 64))
    return path
