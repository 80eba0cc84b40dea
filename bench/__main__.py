"""`python -m bench`: start the real server, measure, print a Markdown table, write the results as JSON.

.venv/bin/python -m bench                 the full run (1,000,000 audit records for the admin section)
.venv/bin/python -m bench --quick         a smoke run: fewer calls, 10,000 audit records
.venv/bin/python -m bench --compare REF   this tree against git REF, both measured in turns in one run
.venv/bin/python -m bench --scale-only    section 8 alone (scale, issue 20)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The bench measures the default setup, SQLite: its cached, seeded databases are SQLite files. (tests/live.py gives
# each server a PostgreSQL database of its own when DATABASE_URL is set, so it must go before that is imported.)
# Section 8's two-workers figure alone runs on PostgreSQL, in databases it makes on this server.
POSTGRES_URL = os.environ.pop("DATABASE_URL", "").strip()

from bench import audit_admin, compare, scale, sections, toolkit_edit, toolkit_grep, toolkit_output  # noqa: E402
from bench import confinement as bench_confinement  # noqa: E402
from bench import policy as bench_policy  # noqa: E402
from bench import recording as bench_recording  # noqa: E402
from bench import redaction as bench_redaction  # noqa: E402
from bench.hop import executor_hop  # noqa: E402
from bench.report import label_throughput, machine_line, sequential, table, targets  # noqa: E402
from bench.server import SERVER_SETTINGS, BenchServer, base_state, git_commit, log, seeded_state, start_server  # noqa: E402
from bench.stats import machine  # noqa: E402
from tests.live import REPO  # noqa: E402

DEFAULT_CACHE = REPO / "var" / "bench"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls and 10,000 audit records: a smoke run")
    parser.add_argument(
        "--records", type=int, help="audit records for the admin section (default 1,000,000; --quick 10,000)"
    )
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where seeded databases are kept (default var/bench)"
    )
    parser.add_argument("--output", type=Path, help="the JSON results (default: <cache>/latest.json)")
    parser.add_argument("--keep", action="store_true", help="keep the servers' temporary directories")
    parser.add_argument("--scale-only", action="store_true", help="only section 8, scale (issue 20)")
    parser.add_argument("--compare", metavar="REF", help="measure this tree against git REF (checked out into a temporary "
                        "worktree, run with this virtualenv), in turns; exits 1 if a ratio got more than 10%% worse")  # fmt: skip
    return parser.parse_args(argv)


async def call_sections(server: BenchServer, sizes: sections.Sizes) -> dict[str, Any]:
    measured = await sections.floors_and_calls(server, sizes)
    spawn, health = measured["spawn_bash"], measured["health"]
    exec_true, read_small = measured["terminal_exec_true"], measured["file_read_1kb"]
    log(f"bench: floors: bash spawn {spawn['median_ms']} ms, /health {health['median_ms']} ms")
    log(f"bench: terminal_exec true {exec_true['median_ms']} ms, file_read 1 KB {read_small['median_ms']} ms")
    large = label_throughput(await sections.throughput(server, sizes), sizes.huge_bytes)
    log(
        "bench: large results "
        + ", ".join(f"{name} {case['mb_per_s']} MB/s +{case['peak_growth_mb']} MB" for name, case in large.items())
    )
    load = await sections.concurrency(server, sizes)
    log(f"bench: {load['clients']} clients: {load['calls_per_s']} calls/s, errors {load['errors'] or 'none'}")
    load["audit"] = sections.audit_check(server, load.pop("sessions"), sizes.calls_per_client)
    log("bench: audit checked")
    toolkit = {
        "edit": await toolkit_edit.measure(server, sizes),
        "grep": await toolkit_grep.measure(server, sizes),
        "output": await toolkit_output.measure(server, sizes),
    }
    edit = toolkit["edit"]
    log(f"bench: file_edit 10 MB {edit['file_edit']['median_ms']} ms, {edit['time_ratio']}x its floor")
    log(
        "bench: file_grep "
        + ", ".join(f"{name} {case['ratio']}x rg" for name, case in toolkit["grep"]["searches"].items())
    )
    log(f"bench: terminal_output wakes {toolkit['output']['wake']['median_ms']} ms after a line")
    policy = bench_policy.measure()
    log(
        f"bench: policy {policy['first_sight_median_us']} µs a call (first sight), {policy['cached_median_us']} µs again"
    )
    redaction = bench_redaction.measure()
    log(f"bench: redaction {redaction['median_us']} µs for a 16 KB output's excerpt (median of its outputs)")
    hop = await executor_hop(sizes.sequential, sizes.warmup)
    log("bench: executor hop " + ", ".join(f"{name} +{case['hop_median_ms']} ms" for name, case in hop.items()))
    confined = await bench_confinement.measure(server, sizes)
    log(
        f"bench: kernel confinement: terminal_exec true workspace/host {confined['terminal_exec_true']['ratio']}x, "
        f"git status read sandbox/unconfined {confined['git_status']['ratio']}x (limit {confined['limit']}x)"
    )
    return {
        "executor_hop": hop,
        **sequential(measured),
        "throughput": large,
        "concurrency": load,
        "toolkit": toolkit,
        "policy": policy,
        "redaction": redaction,
        "confinement": confined,
    }


def server_sections(scratch: Path, base: Path, seeded: Path, sizes: sections.Sizes, records: int) -> dict[str, Any]:
    """Sections 1 to 5 and 7 on a server on the migrated database, then section 6 on one on the seeded records."""
    results: dict[str, Any] = {}
    server = start_server(scratch / "calls", base, SERVER_SETTINGS)
    log(f"bench: server started, pid {server.process.pid if server.process else '?'}")
    try:
        results.update(asyncio.run(call_sections(server, sizes)))
    finally:
        server.stop()
        log("bench: server stopped")
    server = start_server(scratch / "admin", seeded, SERVER_SETTINGS)
    log(f"bench: server on {records:,} audit records started")
    try:
        results["admin"] = asyncio.run(audit_admin.admin_section(server, sizes, records))
    finally:
        server.stop()
    return results


def recording_section(scratch: Path, base: Path, sizes: sections.Sizes) -> dict[str, Any]:
    """Line 2e: `terminal_exec true` with recording on and off, on two servers of their own, in turns."""
    recorded = bench_recording.measure(sizes, base, scratch / "recording")
    log(
        f"bench: terminal_exec true, recording on {recorded['on']['median_ms']} ms, off {recorded['off']['median_ms']} "
        f"ms: {recorded['ratio']}x (limit {recorded['limit']}x)"
    )
    return recorded


def run(options: argparse.Namespace) -> dict[str, Any]:
    sizes = sections.Sizes.quick() if options.quick else sections.Sizes()
    records = options.records or (10_000 if options.quick else 1_000_000)
    results: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": options.quick,
        "machine": machine(),
        "sizes": sizes.__dict__,
    }
    began = time.monotonic()
    # First: an older seeded database is migrated, not reseeded.
    seeded = None if options.scale_only else seeded_state(options.cache, records, log)
    base = base_state(options.cache, log)
    scratch = Path(tempfile.mkdtemp(prefix="sandstorm-bench-"))
    try:
        if seeded is not None:
            results.update(server_sections(scratch, base, seeded, sizes, records))
            results["recording"] = recording_section(scratch, base, sizes)
        scale_sizes = scale.ScaleSizes.quick() if options.quick else scale.ScaleSizes()
        results["scale"] = scale.measure(sizes, scale_sizes, base, scratch / "scale", POSTGRES_URL)
        results["scale"]["sizes"] = scale_sizes.__dict__
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
    if options.compare:
        return compare.main(options)
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
