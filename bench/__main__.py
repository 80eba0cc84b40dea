"""`python -m bench`: start the real server, measure, print a Markdown table, write the results as JSON.

    .venv/bin/python -m bench                 the full run (1,000,000 audit records for the admin section)
    .venv/bin/python -m bench --quick         a smoke run: fewer calls, 10,000 audit records
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The bench measures the default setup, SQLite: its cached, seeded databases are SQLite files. (tests/live.py gives
# each server a PostgreSQL database of its own when DATABASE_URL is set, so it must go before that is imported.)
os.environ.pop("DATABASE_URL", None)

from bench import sections  # noqa: E402
from bench.hop import executor_hop  # noqa: E402
from bench.report import machine_line, table, targets  # noqa: E402
from bench.server import base_state, seeded_state, start_server  # noqa: E402
from bench.stats import machine, ratio  # noqa: E402
from tests.live import REPO, LiveServer  # noqa: E402

DEFAULT_CACHE = REPO / "var" / "bench"
# Limits that would otherwise measure themselves: no rate limit, more call slots than the load uses.
SERVER_SETTINGS = {"SANDSTORM_RATE_LIMIT": "0", "SANDSTORM_MAX_CONCURRENT_CALLS": "200", "SANDSTORM_LOG_FORMAT": "json"}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls and 10,000 audit records: a smoke run")
    parser.add_argument("--records", type=int, help="audit records for the admin section (default 1,000,000; --quick 10,000)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where seeded databases are kept (default var/bench)")
    parser.add_argument("--output", type=Path, help="the JSON results (default: <cache>/latest.json)")
    parser.add_argument("--keep", action="store_true", help="keep the servers' temporary directories")
    return parser.parse_args(argv)


STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


async def call_sections(server: LiveServer, sizes: sections.Sizes) -> dict[str, Any]:
    measured = await sections.floors_and_calls(server, sizes)
    spawn, health = measured["spawn_bash"], measured["health"]
    exec_true, read_small = measured["terminal_exec_true"], measured["file_read_1kb"]
    log(f"bench: floors: bash spawn {spawn['median_ms']} ms, /health {health['median_ms']} ms")
    log(f"bench: terminal_exec true {exec_true['median_ms']} ms, file_read 1 KB {read_small['median_ms']} ms")
    large = await sections.throughput(server, sizes)
    large["file_read_10mb"]["label"] = "`file_read` of a 10 MB file"
    large["terminal_exec_10mb"]["label"] = "`terminal_exec` printing 10 MB"
    large["terminal_exec_huge"]["label"] = f"`terminal_exec` printing {sizes.huge_bytes // sections.MB} MB"
    log("bench: large results " + ", ".join(f"{name} {case['mb_per_s']} MB/s +{case['peak_growth_mb']} MB" for name, case in large.items()))
    load = await sections.concurrency(server, sizes)
    log(f"bench: {load['clients']} clients: {load['calls_per_s']} calls/s, errors {load['errors'] or 'none'}")
    load["audit"] = sections.audit_check(server, load.pop("sessions"), sizes.calls_per_client)
    log("bench: audit checked")
    hop = await executor_hop(sizes.sequential, sizes.warmup)
    log("bench: executor hop " + ", ".join(f"{name} +{case['hop_median_ms']} ms" for name, case in hop.items()))
    return {
        "executor_hop": hop,
        "floors": {"spawn_bash": spawn, "health": health},
        "sequential": {
            "terminal_exec_true": {**exec_true, "floor": "spawn_bash", "ratio": ratio(exec_true["median_ms"], spawn["median_ms"])},
            "file_read_1kb": {**read_small, "floor": "health", "ratio": ratio(read_small["median_ms"], health["median_ms"])},
        },
        "throughput": large,
        "concurrency": load,
    }


async def admin_section(server: LiveServer, sizes: sections.Sizes, records: int) -> dict[str, Any]:
    pages = await sections.admin_pages(server, sizes)
    log(f"bench: admin list page first {pages['list_first_s']} s, warm {pages['list_warm']['median_ms']} ms")
    verify = sections.verify_timing(server)
    log(f"bench: audit_verify {verify['verify_s']} s")
    return {"records": records, "pages": pages, "verify": verify}


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def run(options: argparse.Namespace) -> dict[str, Any]:
    sizes = sections.Sizes.quick() if options.quick else sections.Sizes()
    records = options.records or (10_000 if options.quick else 1_000_000)
    results: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": options.quick,
        "machine": machine(),
        "sizes": sizes.__dict__,
    }
    began = time.monotonic()
    seeded = seeded_state(options.cache, records, log)  # first: an older seeded database is migrated, not reseeded
    base = base_state(options.cache, log)
    scratch = Path(tempfile.mkdtemp(prefix="sandstorm-bench-"))
    try:
        server = start_server(scratch / "calls", base, **SERVER_SETTINGS)
        log(f"bench: server started, pid {server.process.pid if server.process else '?'}")
        try:
            results.update(asyncio.run(call_sections(server, sizes)))
        finally:
            server.stop()
            log("bench: server stopped")
        server = start_server(scratch / "admin", seeded, **SERVER_SETTINGS)
        log(f"bench: server on {records:,} audit records started")
        try:
            results["admin"] = asyncio.run(admin_section(server, sizes, records))
        finally:
            server.stop()
    finally:
        if options.keep:
            log(f"bench: kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    results["seconds"] = round(time.monotonic() - began, 1)
    results["machine"]["load_average_1m_end"] = round(os.getloadavg()[0], 2)  # others' work shifts every figure
    results["targets"] = targets(results)
    return results


def main(argv: list[str]) -> int:
    options = parse(argv)
    results = run(options)
    output = options.output or options.cache / "latest.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nMachine: {machine_line(results)}\n")
    print(table(results))
    missed = [target["what"] for target in results["targets"] if target["met"] is False]
    print(f"\n{len(results['targets']) - len(missed)} of {len(results['targets'])} targets met"
          + (f"; not met: {'; '.join(missed)}" if missed else "") + f". Results: {output}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
