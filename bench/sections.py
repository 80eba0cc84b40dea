"""The measurements, one coroutine per section of the table. Each returns plain JSON-ready data."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from bench.client import Connection, HttpError, McpSession, result_text
from bench.server import BenchServer, log
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


# --- 6. the audit admin on many records --------------------------------------------------------------------------


class AdminBrowser:
    """The admin signed in over HTTP (login form with its CSRF token), a keep-alive connection with the cookies."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.http = connection(server)
        self.cookies: dict[str, str] = {}

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        return {**({"Cookie": cookie} if cookie else {}), **(extra or {})}

    async def get(self, path: str) -> tuple[int, bytes]:
        response = await self.http.request("GET", path, self._headers())
        self._keep_cookies(response.headers.get("set-cookie-all", ""))
        return response.status, response.body

    def _keep_cookies(self, header: str) -> None:
        for cookie in filter(None, header.split("\n")):
            name, _, rest = cookie.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]

    async def login(self) -> None:
        status, page = await self.get("/admin/login/")
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or token is None:
            raise AssertionError(f"no login form ({status})")
        form = urlencode({
            "csrfmiddlewaretoken": token.group(1).decode(), "username": "admin",
            "password": self.server.admin_password, "next": "/admin/",
        }).encode()  # fmt: skip
        headers = self._headers(
            {"Content-Type": "application/x-www-form-urlencoded", "Referer": f"{self.server.url}/admin/login/"}
        )
        response = await self.http.request("POST", "/admin/login/", headers, form)
        self._keep_cookies(response.headers.get("set-cookie-all", ""))
        if response.status != 302 or "sessionid" not in self.cookies:
            raise AssertionError(f"admin login failed ({response.status})")

    async def load(self, path: str, expect: bytes) -> float:
        began = time.perf_counter()
        status, body = await self.get(path)
        elapsed = time.perf_counter() - began
        if status != 200 or expect not in body:
            raise AssertionError(f"{path}: HTTP {status}, {expect!r} not in the page")
        return elapsed


ADMIN_LIST = "/admin/audit/auditrecord/"


def admin_page_paths(older_page: int) -> dict[str, tuple[str, bytes]]:
    """The pages timed besides the plain list: (path, a piece of the page that shows it worked)."""
    week_ago = (datetime.now(UTC) - timedelta(days=7)).date().isoformat()
    return {
        "list_filtered": (ADMIN_LIST + "?tool=file_read", b"file_read"),
        "list_last_7_days": (ADMIN_LIST + f"?created_at__gte={week_ago}", b"result_list"),
        "list_search": (ADMIN_LIST + "?q=pytest", b"pytest"),
        "list_search_no_match": (ADMIN_LIST + "?q=no-such-words-anywhere", b"Showing none"),
        "list_search_all_no_match": (ADMIN_LIST + "?q=no-such-words-anywhere&search_all=1", b"Showing none"),
        "list_older_page": (ADMIN_LIST + f"?p={older_page}", b"result_list"),
        "overview": ("/admin/audit/overview/", b"Calls per hour"),
    }


async def admin_pages(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    browser = AdminBrowser(server)
    await browser.login()
    try:
        results: dict[str, Any] = {"list_first_s": round(await browser.load(ADMIN_LIST, b"Tool calls"), 3)}
        results["list_warm"] = summary([await browser.load(ADMIN_LIST, b"Tool calls") for _ in range(sizes.page_loads)])
        for name, (path, expect) in admin_page_paths(sizes.older_page).items():
            first = await browser.load(path, expect)
            warm = [await browser.load(path, expect) for _ in range(sizes.page_loads)]
            results[name] = {**summary(warm), "first_ms": round(first * 1000, 1), "path": path}
        return results
    finally:
        await browser.http.close()


async def admin_section(server: BenchServer, sizes: Sizes, records: int) -> dict[str, Any]:
    pages = await admin_pages(server, sizes)
    log(f"bench: admin list page first {pages['list_first_s']} s, warm {pages['list_warm']['median_ms']} ms")
    verify = verify_timing(server)
    log(f"bench: audit_verify {verify['verify_s']} s")
    return {"records": records, "pages": pages, "verify": verify}


def verify_timing(server: BenchServer) -> dict[str, Any]:
    began = time.perf_counter()
    done = server.manage("audit_verify", "-v", "2", check=False)
    wall = time.perf_counter() - began
    took = re.search(r"Took ([0-9.]+) s", done.stderr)
    checked = re.search(r"OK: (\d+) records", done.stdout)
    return {
        "ok": done.returncode == 0,
        "records_checked": int(checked.group(1)) if checked else None,
        "verify_s": float(took.group(1)) if took else None,
        "command_wall_s": round(wall, 2),
        "output": (done.stdout or done.stderr).strip()[-300:],
    }


def wait_quiet(seconds: float = 0.5) -> None:
    """A short pause between sections so one section's stragglers (reaped processes, log writes) settle."""
    time.sleep(seconds)


def workspace_file(server: LiveServer, name: str, size: int) -> Path:
    path = server.workspace / name
    path.write_text(("x" * 63 + "\n") * (size // 64))
    return path
