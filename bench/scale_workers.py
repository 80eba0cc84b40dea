"""Section 8, figure 1: two workers against one, on PostgreSQL (bench/scale.py says how)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil

from bench import sections
from bench.scale_sizes import ScaleSizes
from bench.server import SERVER_SETTINGS, BenchServer, log
from tests.live import LiveServer, free_port, make_server
from tests.redis_server import running_redis
from tests.test_deploy_caddy_live import caddy_in_front, daphne_on_socket, executor_on_socket

# What the stacks need besides PostgreSQL.
STACK_TOOLS = ("redis-server", "caddy", "systemd-socket-activate")
DATABASE_PREFIX = "sandstorm_bench_"


def skip_reason(postgres_url: str) -> str | None:
    """Why figure 1 cannot run here, or None."""
    if not postgres_url:
        return "no DATABASE_URL (PostgreSQL): run `DATABASE_URL=postgres://… make bench`"
    missing = [tool for tool in STACK_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)}"
    import psycopg  # the postgres extra: only needed once PostgreSQL is asked for

    try:
        psycopg.connect(postgres_url, connect_timeout=10).close()
    except psycopg.OperationalError as error:
        return f"PostgreSQL does not answer: {str(error).strip().splitlines()[0]}"
    return None


@dataclass
class Stack:
    """One installation of figure 1, running."""

    front: LiveServer  # worker 1 as a client sees it: at Caddy's port
    workers: list[LiveServer]

    def workers_cpu_s(self) -> float:
        """CPU seconds the workers' processes have used (user and system)."""
        total = 0.0
        for worker in self.workers:
            assert worker.process is not None
            times = psutil.Process(worker.process.pid).cpu_times()
            total += times.user + times.system
        return total

    def log_errors(self, limit: int = 5) -> list[str]:
        """The workers' first error lines: what the server said when calls failed (the client sees a status)."""
        found = []
        for number, worker in enumerate(self.workers, start=1):
            for line in worker.log().splitlines():
                if '"level": "ERROR"' in line or line.startswith("Traceback"):
                    found.append(f"worker {number}: {line[:500]}")
        return found[:limit]


def workers_figure(sizes: sections.Sizes, scale: ScaleSizes, root: Path, postgres_url: str) -> dict[str, Any]:
    reason = skip_reason(postgres_url)
    if reason is not None:
        log(f"bench: scale: two workers against one skipped: {reason}")
        return {"skipped": reason}
    with contextlib.ExitStack() as stacks:
        built = {
            label: stacks.enter_context(caddy_stack(root / f"{label}-worker", int(label), postgres_url))
            for label in ("1", "2")
        }
        log("bench: scale: one worker and two behind Caddy, on PostgreSQL, started")
        loads, machine_busy = asyncio.run(loads_in_turn(built, sizes, scale))
        for label, load in loads.items():  # while its database is there: it goes with the stack
            checked = bench_server(built[label].front)
            load["audit"] = sections.audit_check(checked, load.pop("sessions"), sizes.calls_per_client)
            load["log_errors"] = built[label].log_errors()
    one, two = loads["1"], loads["2"]
    ratio = round(two["calls_per_s"] / one["calls_per_s"], 2) if one["calls_per_s"] else None
    log(
        f"bench: scale: 1 worker {one['calls_per_s']} calls/s, 2 workers {two['calls_per_s']} calls/s ({ratio}x), "
        f"errors {dict(Counter(one['errors']) + Counter(two['errors'])) or 'none'}; the machine "
        f"{machine_busy:.0%} busy, the workers {one['worker_cores']} and {two['worker_cores']} cores of it"
    )
    for line in one["log_errors"] + two["log_errors"]:
        log(f"bench: scale: in a worker's log: {line[:300]}")
    return {
        "database": "postgresql",
        "one_worker": one,
        "two_workers": two,
        "ratio": ratio,
        "machine_busy": round(machine_busy, 3),
    }


async def loads_in_turn(
    built: dict[str, Stack], sizes: sections.Sizes, scale: ScaleSizes
) -> tuple[dict[str, dict[str, Any]], float]:
    """A short warm-up load on each stack (its first calls open database connections and import lazily), then
    section 5's load `scale.rounds` times on each, stack after stack in turn, so both span the same stretch of a
    noisy machine. Also how busy the machine's cores were meanwhile (0 to 1): workers can only use idle cores."""
    fronts = {label: stack.front for label, stack in built.items()}
    warm = await sections.concurrency_of(fronts, replace(sizes, calls_per_client=scale.warmup_calls), 1)
    cpu_before = {label: stack.workers_cpu_s() for label, stack in built.items()}
    busy_before = machine_jiffies()
    loads = await sections.concurrency_of(fronts, sizes, scale.rounds)
    busy_after = machine_jiffies()
    for label, load in loads.items():
        load["warmup_errors"] = warm[label]["errors"]
        cpu = built[label].workers_cpu_s() - cpu_before[label]
        load["worker_cpu_ms_per_call"] = round(1000 * cpu / load["calls"], 2) if load["calls"] else None
        load["worker_cores"] = round(cpu / load["seconds"], 2)  # cores the workers kept busy, on average
    total = busy_after[1] - busy_before[1]
    return loads, (busy_after[0] - busy_before[0]) / total if total else 0.0


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat's first line; idle and iowait are not busy."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(values) - values[3] - values[4], sum(values)


@contextlib.contextmanager
def caddy_stack(root: Path, workers: int, postgres_url: str) -> Iterator[Stack]:
    """`workers` workers of one installation behind Caddy, as tests/test_workers_live.py's fixture builds them."""
    port = free_port()
    run, workspace = root / "run", root / "workspace"
    workspace.mkdir(parents=True)
    (root / "redis").mkdir()
    with contextlib.ExitStack() as stack:
        _, executor_socket = stack.enter_context(executor_on_socket(root, workspace))
        redis = stack.enter_context(running_redis(root / "redis"))
        database = stack.enter_context(postgres_database(postgres_url))  # dropped once the workers have stopped
        common = {
            **SERVER_SETTINGS,
            "SANDSTORM_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "SANDSTORM_EXECUTOR_SOCKET": str(executor_socket),
            "SANDSTORM_WORKSPACE_ROOT": str(workspace),
            "SANDSTORM_WORKERS": str(workers),
            "SANDSTORM_REDIS_URL": redis.url,
            "DATABASE_URL": database,
        }
        servers = stack_servers(root, workers, common)
        for number, server in enumerate(servers, start=1):
            stack.enter_context(daphne_on_socket(server, run / f"worker-{number}.sock"))
        stack.enter_context(caddy_in_front(root, run, port, workers=workers))
        yield Stack(replace(servers[0], port=port), servers)


def stack_servers(root: Path, workers: int, common: dict[str, str]) -> list[LiveServer]:
    """The workers' settings: one installation, so the state dir (keys), bootstrap token and admin password are the
    first worker's."""
    first = make_server(root / "w1", SANDSTORM_WORKER="1", **common)
    servers = [first]
    for number in range(2, workers + 1):
        other = make_server(
            root / f"w{number}",
            SANDSTORM_WORKER=str(number),
            SANDSTORM_STATE_DIR=first.env["SANDSTORM_STATE_DIR"],
            SANDSTORM_MCP_TOKEN=first.token,
            SANDSTORM_ADMIN_PASSWORD=first.admin_password,
            **common,
        )
        other.token, other.admin_password = first.token, first.admin_password
        servers.append(other)
    return servers


def bench_server(server: LiveServer) -> BenchServer:
    """`server` as sections.audit_check takes it: its database jobs run with its environment (its PostgreSQL
    database), from this tree."""
    return BenchServer(**{item.name: getattr(server, item.name) for item in fields(LiveServer) if item.init})


@contextlib.contextmanager
def postgres_database(url: str) -> Iterator[str]:
    """A database of its own on the PostgreSQL server `url` names (as tests/live.py gives each live server one when
    the suite runs on PostgreSQL), dropped afterwards; yields its URL."""
    import psycopg
    from psycopg import sql

    name = DATABASE_PREFIX + secrets.token_hex(6)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    finally:
        drop_database(url, name)


def drop_database(url: str, name: str) -> None:
    """DROP DATABASE, after ending the connections a stopping worker may still hold (autovacuum's, which a
    non-superuser may not end, end by themselves on a plain DROP; hence a few tries)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as admin:
        for attempt in range(5):
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid() AND usename = current_user",
                (name,),
            )
            try:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
                return
            except psycopg.errors.ObjectInUse:
                if attempt == 4:
                    raise
                time.sleep(0.5)
