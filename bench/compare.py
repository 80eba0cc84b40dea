"""`python -m bench --compare REF`: this tree against git REF, both measured in one run, in turns.

REF is checked out into a temporary git worktree and run with this interpreter and virtualenv (nothing is
installed; if REF pins other dependencies, the run says so). Each tree runs its own manage.py, migrations, seeder
and server on its own copies of its own cached databases (REF's under <cache>/compare/ unless the schemas are
the same). Both servers run at once and every measurement goes to them in turns, so that the machine's noise falls
on both:

    1 to 3   the floors and the sequential calls: BATCH calls of one kind on one server, every kind on both
             servers in each round, the order rotating round after round
    4        large results: one call at a time, old and new in turn
    5        the concurrent load: twice on each server, old, new, new, old
    3b       the executor hop: once per tree, in a process of the tree's own (it is in turns within itself)
    6        the admin on the seeded records: once per tree (old, then new), a server of each in turn

Both tables are printed, then the change of the headline figures and the verdict on the issue 16 rule: the
terminal_exec and file_read ratios to their floors may not grow by more than 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench import audit_admin, sections
from bench.report import label_throughput, machine_line, sequential, table, targets
from bench.server import (
    SERVER_SETTINGS,
    BenchServer,
    base_state,
    git_commit,
    log,
    schema_key,
    seeded_state,
    start_server,
)
from bench.stats import machine
from bench.table_cells import ms
from tests.live import REPO

TREES = ("old", "new")
WORSE_LIMIT = 1.10  # issue 16: each ratio may grow by at most 10% over the old tree's
LOAD_ROUNDS = 2
RULES = (
    ("terminal_exec_true", "`terminal_exec true` / spawn floor"),
    ("file_read_1kb", "`file_read` 1 KB / `/health` floor"),
)


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[tuple[Path, str]]:
    """REF in a temporary, detached git worktree (removed afterwards): its path and short commit."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--short", f"{ref}^{{commit}}"], cwd=REPO,
                           capture_output=True, text=True, check=False)  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"bench --compare: {ref!r} is not a commit: {found.stderr.strip()}")
    parent = Path(tempfile.mkdtemp(prefix="sandstorm-bench-old-"))
    tree = parent / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(tree), found.stdout.strip()], cwd=REPO, check=True
    )
    try:
        yield tree, found.stdout.strip()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
        shutil.rmtree(parent, ignore_errors=True)


def dependencies(tree: Path) -> dict[str, object]:
    """What the virtualenv must hold for `tree`: its pinned versions and declared dependencies."""
    lock = tree / "requirements.lock"
    project = tomllib.loads((tree / "pyproject.toml").read_text()).get("project", {})
    return {
        "requirements.lock": lock.read_text() if lock.exists() else None,
        "dependencies": project.get("dependencies"),
        "optional-dependencies": project.get("optional-dependencies"),
    }


def differences(old: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """The names of the entries that differ."""
    return [name for name in new if old.get(name) != new[name]]


def hop_of(tree: Path, sizes: sections.Sizes) -> dict[str, Any]:
    """The executor hop measured by the tree's own bench/hop.py and executor, in a process started in the tree."""
    code = ("import asyncio, json, sys; from bench.hop import executor_hop; "
            f"json.dump(asyncio.run(executor_hop({sizes.sequential}, {sizes.warmup})), sys.stdout)")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=900, check=True
    )
    hop: dict[str, Any] = json.loads(done.stdout)
    return hop


async def call_sections(servers: dict[str, BenchServer], sizes: sections.Sizes) -> dict[str, dict[str, Any]]:
    """Sections 1 to 5 on both servers, in turns."""
    measured = await sections.floors_and_calls_of(dict(servers), sizes)
    for label in servers:
        case = measured[label]
        log(f"bench: {label}: spawn {case['spawn_bash']['median_ms']} ms, /health {case['health']['median_ms']} ms, "
            f"terminal_exec {case['terminal_exec_true']['median_ms']} ms, file_read {case['file_read_1kb']['median_ms']} ms")  # fmt: skip
    large = await sections.throughput_of(dict(servers), sizes)
    log("bench: large results measured")
    loads = await sections.concurrency_of(dict(servers), sizes, LOAD_ROUNDS)
    results: dict[str, dict[str, Any]] = {}
    for label, server in servers.items():
        load = loads[label]
        load["audit"] = sections.audit_check(server, load.pop("sessions"), sizes.calls_per_client)
        log(f"bench: {label}: {load['calls_per_s']} calls/s, errors {load['errors'] or 'none'}, audit checked")
        results[label] = {
            **sequential(measured[label]),
            "throughput": label_throughput(large[label], sizes.huge_bytes),
            "concurrency": load,
        }
    return results


def _borrow(source: Path, target: Path) -> None:
    if (source / "state").is_dir() and not target.exists():
        building = target.with_name(f"{target.name}.building-{os.getpid()}")
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", "--reflink=auto", str(source), str(building)], check=True)
        building.rename(target)
        log(f"bench: copied {source.name} for the old tree")


def measure(
    options: argparse.Namespace, trees: dict[str, Path], sizes: sections.Sizes, records: int
) -> dict[str, dict[str, Any]]:
    old_key = schema_key(trees["old"])
    same_schema = old_key == schema_key(trees["new"])
    caches = {"old": options.cache if same_schema else options.cache / "compare", "new": options.cache}
    if not same_schema:
        # A plain run of REF's code left its databases in the cache: copied, not seeded again (this tree's run
        # would migrate them away).
        for name in (f"base-{old_key}", f"seed{records}-{old_key}"):
            _borrow(options.cache / name, caches["old"] / name)
    # The old tree's cache is never migrated forward from a newer schema: REF may be older than what it holds.
    seeded = {
        label: seeded_state(caches[label], records, log, trees[label], reuse_older=label == "new") for label in TREES
    }
    base = {label: base_state(caches[label], log, trees[label]) for label in TREES}
    scratch = Path(tempfile.mkdtemp(prefix="sandstorm-bench-compare-"))
    results: dict[str, dict[str, Any]] = {}
    try:
        servers: dict[str, BenchServer] = {}
        try:
            for label in TREES:
                servers[label] = start_server(scratch / label / "calls", base[label], SERVER_SETTINGS, trees[label])
            log("bench: both servers started")
            results = asyncio.run(call_sections(servers, sizes))
        finally:
            for server in servers.values():
                server.stop()
        for label in TREES:
            results[label]["executor_hop"] = hop_of(trees[label], sizes)
            log(f"bench: {label}: executor hop measured")
        for label in TREES:
            server = start_server(scratch / label / "admin", seeded[label], SERVER_SETTINGS, trees[label])
            log(f"bench: {label}: server on {records:,} audit records started")
            try:
                results[label]["admin"] = asyncio.run(audit_admin.admin_section(server, sizes, records))
            finally:
                server.stop()
    finally:
        if options.keep:
            log(f"bench: kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def run(options: argparse.Namespace) -> dict[str, Any]:
    sizes = sections.Sizes.quick() if options.quick else sections.Sizes()
    records = options.records or (10_000 if options.quick else 1_000_000)
    began = time.monotonic()
    with checkout(options.compare) as (old_tree, old_commit):
        trees = {"old": old_tree, "new": REPO}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        commits = {"old": old_commit, "new": git_commit() + ("+changes" if dirty.stdout.strip() else "")}
        common: dict[str, Any] = {
            "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "quick": options.quick,
            "machine": machine(),
            "sizes": sizes.__dict__,
        }
        differ = differences(dependencies(old_tree), dependencies(REPO))
        if differ:
            log(f"bench: {options.compare} has other {', '.join(differ)} than this tree; both run with this virtualenv")
        measured = measure(options, trees, sizes, records)
    end_load = round(os.getloadavg()[0], 2)
    results: dict[str, Any] = {
        "ref": options.compare,
        "dependencies_differ": differ,
        "seconds": round(time.monotonic() - began, 1),
    }
    for label in TREES:
        tree = {**common, "commit": commits[label], **measured[label]}
        tree["machine"] = {**common["machine"], "load_average_1m_end": end_load}
        tree["targets"] = targets(tree)
        results[label] = tree
    results["verdict"] = verdict(results["old"], results["new"])
    return results


def verdict(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Each ratio rule: the old and the new ratio, the change, and whether the new one is within the limit."""
    found = []
    for name, what in RULES:
        before, after = old["sequential"][name]["ratio"], new["sequential"][name]["ratio"]
        met = None if before is None or after is None else after <= WORSE_LIMIT * before
        change = None if not before or after is None else round(after / before - 1, 4)
        found.append({"key": name, "what": what, "old": before, "new": after, "change": change, "met": met})
    return found


def _change(before: float | None, after: float | None) -> str:
    return "–" if not before or after is None else f"{(after / before - 1) * 100:+.1f}%"


def _show(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == " ms":
        return ms(value)
    return f"{value:.3f} ms" if unit == " ms hop" else f"{value}{unit}"


def headline(old: dict[str, Any], new: dict[str, Any]) -> str:
    """One table of the figures that say most, old beside new."""

    def row(what: str, pick: Any, unit: str) -> str:
        before, after = pick(old), pick(new)
        return f"| {what} | {_show(before, unit)} | {_show(after, unit)} | {_change(before, after)} |"

    rows = ["| measurement | old | new | change |", "|---|---|---|---|"]
    rows.append(row("floor: bash spawn, median", lambda r: r["floors"]["spawn_bash"]["median_ms"], " ms"))
    rows.append(row("floor: `GET /health`, median", lambda r: r["floors"]["health"]["median_ms"], " ms"))
    for name, what in RULES:
        rows.append(
            row(f"{what.split(' /')[0]}, median", lambda r, name=name: r["sequential"][name]["median_ms"], " ms")
        )
        rows.append(row(f"{what}, ratio", lambda r, name=name: r["sequential"][name]["ratio"], "x"))
    for name in ("file_read_1kb", "terminal_exec_true"):
        rows.append(
            row(f"executor hop, {name}", lambda r, name=name: r["executor_hop"][name]["hop_median_ms"], " ms hop")
        )
    for name in ("file_read_10mb", "terminal_exec_10mb", "terminal_exec_huge"):
        rows.append(
            row(f"{old['throughput'][name]['label']}", lambda r, name=name: r["throughput"][name]["mb_per_s"], " MB/s")
        )
    rows.append(row("concurrent clients, calls/s", lambda r: r["concurrency"]["calls_per_s"], ""))
    rows.append(row("audit list page, warm median", lambda r: r["admin"]["pages"]["list_warm"]["median_ms"], " ms"))
    rows.append(row("`audit_verify`", lambda r: r["admin"]["verify"]["verify_s"], " s"))
    return "\n".join(rows)


def report(results: dict[str, Any], output: Path) -> str:
    old, new, differ = results["old"], results["new"], results["dependencies_differ"]
    how = (f"Sections 1 to 3 in turns (every kind on both servers in each round of {sections.BATCH}), 4 call by call in "
           f"turns, 5 {LOAD_ROUNDS} times on each in turns; 3b (executor hop) and 6 (admin on {old['admin']['records']:,} "
           "seeded records) once per tree, old first.")  # fmt: skip
    lines = [
        f"\nMachine: {machine_line(new)}\n",
        f"## old: {results['ref']} ({old['commit']})\n",
        table(old),
        f"\n## new: this tree ({new['commit']})\n",
        table(new),
        "\n## old → new\n",
        headline(old, new),
        f"\n{how}"
        + (f" {results['ref']} has other {', '.join(differ)}: both ran with this virtualenv." if differ else ""),
        "",
    ]
    for rule in results["verdict"]:
        mark = (
            "–"
            if rule["met"] is None
            else "met (not worse by more than 10%)"
            if rule["met"]
            else "**NOT MET: worse by more than 10%**"
        )
        lines.append(
            f"- {rule['what']}: old {rule['old']}x, new {rule['new']}x ({_change(rule['old'], rule['new'])}): {mark}"
        )
    lines.append(f"\nResults: {output}")
    return "\n".join(lines)


def main(options: argparse.Namespace) -> int:
    results = run(options)
    output = options.output or options.cache / "compare.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results, output))
    return 0 if all(rule["met"] is not False for rule in results["verdict"]) else 1
