"""Section 8's targets (issue 20) and its rows of the bench's Markdown table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.table_cells import combined, met, ms

# Issue 20 (section 8): two workers against one, a new client's connect beside 1,000 open sessions (median), and how
# much slower a 1 KB read gets beside 100 sleeping calls (median against median alone).
WORKERS_RATIO = 1.6
CONNECT_LIMIT_MS = 100
READ_DELAY_MS = 5
READ_PATH_RATIO = 0.75  # a read's records committed after it, against its started record first: ≥ 25% faster


def scale_targets(scale: dict[str, Any], add: Callable[[str, str, Any, str, bool | None], None]) -> None:
    """Issue 20's targets; none for a figure that was skipped (it is neither met nor missed)."""
    workers = scale["workers"]
    if "skipped" not in workers:
        one, two, ratio = workers["one_worker"], workers["two_workers"], workers["ratio"]
        add("workers_ratio", "two workers / one worker, calls/s (PostgreSQL, through Caddy)", ratio,
            f"≥ {WORKERS_RATIO}x", ratio is not None and ratio >= WORKERS_RATIO)  # fmt: skip
        errors = sum(one["errors"].values()) + sum(two["errors"].values())
        add("workers_errors", "one and two workers: errors", errors, "0", errors == 0)
        audits = (one["audit"], two["audit"])
        exact = all(_exact(audit) and audit["chain_intact"] for audit in audits)
        add("workers_audit", "one and two workers: audit records per call, chain", exact, "exactly 2, intact", exact)
    sessions = scale["sessions"]
    connect = sessions["connect"]["median_ms"]
    add("connect_median", f"a new client's connect beside {sessions['opened']:,} open sessions, median", connect,
        f"< {CONNECT_LIMIT_MS} ms", connect is not None and connect < CONNECT_LIMIT_MS)  # fmt: skip
    sleepers = scale["sleepers"]
    delay = sleepers["difference_ms"]
    add("read_beside_sleepers", f"file_read 1 KB beside {sleepers['sleepers']} sleeping calls − alone, median",
        delay, f"≤ {READ_DELAY_MS} ms", delay is not None and delay <= READ_DELAY_MS)  # fmt: skip
    add("sleepers_ok", "the sleeping calls all ended with exit code 0", sleepers["sleepers_ok"],
        f"{sleepers['sleepers']}", sleepers["sleepers_ok"] == sleepers["sleepers"])  # fmt: skip
    reads = scale.get("reads")
    if reads:
        add("read_path", "file_read 1 KB, records after the read / started record before it, median, SQLite",
            reads["ratio"], f"≤ {READ_PATH_RATIO}x", reads["ratio"] is not None and reads["ratio"] <= READ_PATH_RATIO)  # fmt: skip
        on_postgres = reads.get("postgresql", {})
        if "ratio" in on_postgres:
            ratio = on_postgres["ratio"]
            add("read_path_postgresql", "the same on PostgreSQL", ratio, f"≤ {READ_PATH_RATIO}x",
                ratio is not None and ratio <= READ_PATH_RATIO)  # fmt: skip


def _exact(audit: dict[str, Any]) -> bool:
    return bool(audit["records"] == audit["records_expected"] and audit["sessions_with_wrong_counts"] == 0)


def scale_rows(scale: dict[str, Any] | None, found: list[dict[str, Any]]) -> list[str]:
    if not scale:
        return []
    return (
        _workers_rows(scale["workers"], found)
        + _sessions_rows(scale["sessions"], found)
        + _sleepers_rows(scale["sleepers"], found)
        + _reads_rows(scale.get("reads"), found)
    )


def _reads_rows(reads: dict[str, Any] | None, found: list[dict[str, Any]]) -> list[str]:
    if not reads:
        return []
    rows = _read_path_rows(reads, "SQLite", met(found, "read_path"))
    on_postgres = reads.get("postgresql", {})
    if "skipped" in on_postgres:
        rows.append(
            f"| 8 | the same on PostgreSQL: **skipped**, {on_postgres['skipped']} | | | | ≤ {READ_PATH_RATIO}x | – |"
        )
    elif on_postgres:
        rows += _read_path_rows(on_postgres, "PostgreSQL", met(found, "read_path_postgresql"))
    return rows


def _read_path_rows(reads: dict[str, Any], database: str, mark: str) -> list[str]:
    after, before = reads["after"], reads["before"]
    return [
        f"| 8 | `file_read` 1 KB on {database}, its started record committed before the read "
        f"(`SANDSTORM_AUDIT_READS_BEFORE=1`) ({before['n']}) | {ms(before['median_ms'])} | {ms(before['p95_ms'])} | "
        "1x | | |",
        f"| 8 | `file_read` 1 KB on {database}, both records committed after the read (the default), in turns with "
        f"the row above ({after['n']}) | {ms(after['median_ms'])} | {ms(after['p95_ms'])} | {reads['ratio']}x | "
        f"≤ {READ_PATH_RATIO}x | {mark} |",
    ]


def _workers_rows(workers: dict[str, Any], found: list[dict[str, Any]]) -> list[str]:
    if "skipped" in workers:
        return [f"| 8 | two workers against one: **skipped**, {workers['skipped']} | | | | ≥ {WORKERS_RATIO}x | – |"]
    rows = []
    for key, label in (("one_worker", "one worker"), ("two_workers", "two workers")):
        load, latency = workers[key], workers[key]["latency"]
        errors = ", ".join(f"{kind} {count}" for kind, count in sorted(load["errors"].items())) or "none"
        if load.get("warmup_errors"):
            errors += f" (warm-up: {', '.join(f'{kind} {count}' for kind, count in load['warmup_errors'].items())})"
        if key == "two_workers":  # the ratio and its target on the second row
            vs, target = f"{workers['ratio']}x one worker", f"≥ {WORKERS_RATIO}x, no errors"
            mark = combined(found, "workers_ratio", "workers_errors")
        else:
            vs, target, mark = "1x", "", ""
        rows.append(
            f"| 8 | {label}, PostgreSQL, through Caddy: {load['clients']} clients × {load['calls_per_client']} "
            f"`terminal_exec true`, {load['rounds']} loads in turns: **{load['calls_per_s']} calls/s**, errors: "
            f"{errors}; the workers used {load['worker_cores']} cores ({load['worker_cpu_ms_per_call']} ms a call) | "
            f"{ms(latency['median_ms'])} | {ms(latency['p95_ms'])} | {vs} | {target} | {mark} |"
        )
    audits = "; ".join(
        f"{label} {audit['records']} records for {audit['records_expected'] // 2} calls, chain "
        + ("intact" if audit["chain_intact"] else "BROKEN")
        for label, audit in (("one worker", workers["one_worker"]["audit"]), ("two", workers["two_workers"]["audit"]))
    )
    rows.append(f"| 8 | audit after the loads: {audits} | | | | 2 per call, intact | {met(found, 'workers_audit')} |")
    rows.append(f"| 8 | the machine's cores during the loads: {workers['machine_busy']:.0%} busy | | | | | |")
    return rows


def _sessions_rows(sessions: dict[str, Any], found: list[dict[str, Any]]) -> list[str]:
    growth = sessions["rss_growth_kb"]
    memory = "RSS not readable" if growth is None else f"server RSS +{growth / 1024:.1f} MB"
    connect = sessions["connect"]
    return [
        f"| 8 | {sessions['opened']:,} open sessions ({sessions['credentials']} credentials × "
        f"{sessions['sessions_per_credential']}, one server, SQLite): {memory}, **{sessions['kb_per_session']} KB a "
        f"session**; {sessions['still_open']:,} still open at the end | | | | | |",
        f"| 8 | a new client's connect beside them: TCP and `initialize` ({connect['n']}) | {ms(connect['median_ms'])} | "
        f"{ms(connect['p95_ms'])} | | < {CONNECT_LIMIT_MS} ms (median) | {met(found, 'connect_median')} |",
    ]


def _sleepers_rows(sleepers: dict[str, Any], found: list[dict[str, Any]]) -> list[str]:
    alone, beside, difference = sleepers["alone"], sleepers["beside"], sleepers["difference_ms"]
    return [
        f"| 8 | `file_read` 1 KB alone ({alone['n']}) | {ms(alone['median_ms'])} | {ms(alone['p95_ms'])} | | | |",
        f"| 8 | `file_read` 1 KB while {sleepers['running_when_sampled']} `terminal_exec sleep {sleepers['sleep_s']}` "
        f"run ({beside['n']}); {sleepers['sleepers_ok']}/{sleepers['sleepers']} sleeps ended OK | "
        f"{ms(beside['median_ms'])} | {ms(beside['p95_ms'])} | "
        f"{'–' if difference is None else f'{difference:+.2f} ms'} | "
        f"≤ {READ_DELAY_MS} ms more (median), all OK | {combined(found, 'read_beside_sleepers', 'sleepers_ok')} |",
    ]
