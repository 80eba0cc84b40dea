"""The targets (issue 6's, and those of later issues), and the Markdown table of a run."""

from __future__ import annotations

from typing import Any

from bench.report_scale import scale_rows, scale_targets
from bench.stats import ratio
from bench.table_cells import combined, met, ms

MB = 1_000_000

PAGE_LIMIT_S = 0.5
MEMORY_LIMIT_MB = 50
VERIFY_LIMIT_S = 30
SPAWN_RATIO, HEALTH_RATIO = 4, 2
CALLS_PER_S = 150
HOP_LIMIT_MS = 0.5  # issue 7: the executor process may add at most this per call over the in-process path
POLICY_LIMIT_US = 100  # issue 19: deciding a call by the command policy
HEADER = ["| # | measurement | median | p95 | vs floor | target | |", "|---|---|---|---|---|---|---|"]


def sequential(measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The floors and the sequential calls (sections 1 to 3) as the results hold them: each call with its ratio."""
    spawn, health = measured["spawn_bash"], measured["health"]
    exec_true, read_small = measured["terminal_exec_true"], measured["file_read_1kb"]
    return {
        "floors": {"spawn_bash": spawn, "health": health},
        "sequential": {
            "terminal_exec_true": {
                **exec_true,
                "floor": "spawn_bash",
                "ratio": ratio(exec_true["median_ms"], spawn["median_ms"]),
            },
            "file_read_1kb": {
                **read_small,
                "floor": "health",
                "ratio": ratio(read_small["median_ms"], health["median_ms"]),
            },
        },
    }


def label_throughput(large: dict[str, Any], huge_bytes: int) -> dict[str, Any]:
    """Section 4's results, each with the label the table shows."""
    large["file_read_10mb"]["label"] = "`file_read` of a 10 MB file"
    large["terminal_exec_10mb"]["label"] = "`terminal_exec` printing 10 MB"
    large["terminal_exec_huge"]["label"] = f"`terminal_exec` printing {huge_bytes // 1_000_000} MB"
    return large


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: what, the measured value, the limit and whether it is met."""
    found: list[dict[str, Any]] = []

    def add(key: str, what: str, value: Any, limit: str, met: bool | None) -> None:
        found.append({"key": key, "what": what, "value": value, "limit": limit, "met": met})

    seq = results.get("sequential", {})
    if "terminal_exec_true" in seq:
        ratio = seq["terminal_exec_true"]["ratio"]
        add(
            "exec_ratio",
            "terminal_exec true median / bash spawn floor",
            ratio,
            f"≤ {SPAWN_RATIO}x",
            ratio is not None and ratio <= SPAWN_RATIO,
        )
    if "file_read_1kb" in seq:
        ratio = seq["file_read_1kb"]["ratio"]
        add(
            "read_ratio",
            "file_read 1 KB median / GET /health",
            ratio,
            f"≤ {HEALTH_RATIO}x",
            ratio is not None and ratio <= HEALTH_RATIO,
        )
    policy = results.get("policy")
    if policy:
        cost = policy["first_sight_median_us"]
        add("policy", "command policy per call (20 rules, first sight of the command), median", cost,
            f"< {POLICY_LIMIT_US} µs", cost < POLICY_LIMIT_US)  # fmt: skip
    hop = results.get("executor_hop", {}).get("file_read_1kb")
    if hop:
        add("hop", "executor hop (file_read 1 KB, socket − in-process median)", hop["hop_median_ms"], f"< {HOP_LIMIT_MS} ms",
            hop["hop_median_ms"] < HOP_LIMIT_MS)  # fmt: skip
    confined = results.get("confinement")
    if confined:
        for key, what in (
            ("terminal_exec_true", "terminal_exec true, `workspace` credential / `host` credential (medians)"),
            ("git_status", "git status in the read sandbox / unconfined (medians)"),
        ):
            case = confined[key]
            add(f"confinement_{key}", what, case["ratio"], f"≤ {confined['limit']}x", case["within_limit"])
    recording = results.get("recording")
    if recording:
        add("recording", "terminal_exec true, recording on / recording off (medians in turns)", recording["ratio"],
            f"≤ {recording['limit']}x", recording["within_limit"])  # fmt: skip
    for name, case in results.get("throughput", {}).items():
        growth = case.get("peak_growth_mb")
        add(f"memory_{name}", f"peak memory growth, {case['label']}", growth, f"< {MEMORY_LIMIT_MB} MB",
            None if growth is None else growth < MEMORY_LIMIT_MB)  # fmt: skip
    load = results.get("concurrency")
    if load:
        audit = load["audit"]
        add("errors", "concurrent clients: errors", sum(load["errors"].values()), "0", not load["errors"])
        add(
            "calls_per_s",
            "concurrent clients: calls/s",
            load["calls_per_s"],
            f"≥ {CALLS_PER_S}",
            load["calls_per_s"] >= CALLS_PER_S,
        )
        add("locked", 'concurrent clients: "database is locked" in the log', audit["database_locked_in_log"], "0",
            audit["database_locked_in_log"] == 0)  # fmt: skip
        exact = audit["records"] == audit["records_expected"] and audit["sessions_with_wrong_counts"] == 0
        add(
            "two_records",
            "audit records per call",
            f"{audit['records']}/{audit['records_expected'] // 2} calls",
            "exactly 2",
            exact,
        )
        add("chain", "audit chain after the load", audit["chain_intact"], "intact", audit["chain_intact"])
    toolkit = results.get("toolkit")
    if toolkit:
        edit = toolkit["edit"]
        add("edit_time", "file_edit 10 MB median / read + rewrite + /health floor", edit["time_ratio"],
            f"≤ {edit['time_target']}x", edit["time_met"])  # fmt: skip
        add("edit_memory", "file_edit 10 MB: executor peak growth / file size", edit["memory_ratio"],
            f"< {edit['memory_target']}x", edit["memory_met"])  # fmt: skip
        grep = toolkit["grep"]
        for name, case in grep["searches"].items():
            add(f"grep_{name}", f"file_grep {name} median / rg + /health floor", case["ratio"],
                f"≤ {grep['target_ratio']}x", case["ratio_met"])  # fmt: skip
            add(f"grep_memory_{name}", f"file_grep {name}: server + executor peak growth", case["peak_growth_mb"],
                f"< {grep['target_memory_mb']} MB", case["memory_met"])  # fmt: skip
        output = toolkit["output"]
        add("output_wake", "terminal_output wait: median ms from a line to its answer", output["wake"]["median_ms"],
            f"≤ {output['target_ms']:g} ms", output["met"])  # fmt: skip
    admin = results.get("admin")
    if admin:
        pages = admin["pages"]
        add(
            "list_first",
            "audit list page, first load",
            pages["list_first_s"],
            f"< {PAGE_LIMIT_S} s",
            pages["list_first_s"] < PAGE_LIMIT_S,
        )
        warm = pages["list_warm"]["p95_ms"] / 1000
        add("list_warm", "audit list page, warm p95", warm, f"< {PAGE_LIMIT_S} s", warm < PAGE_LIMIT_S)
        verify = admin["verify"]
        seconds = verify["verify_s"]
        add("verify", f"audit_verify of {verify['records_checked'] or 0:,} records", seconds, f"< {VERIFY_LIMIT_S} s",
            verify["ok"] and seconds is not None and seconds < VERIFY_LIMIT_S)  # fmt: skip
    if results.get("scale"):
        scale_targets(results["scale"], add)
    return found


def table(results: dict[str, Any]) -> str:
    """The Markdown table the README shows (section 8's rows alone after --scale-only)."""
    found = results["targets"]
    if "floors" not in results:
        return "\n".join(HEADER + scale_rows(results.get("scale"), found))
    floors, seq = results["floors"], results["sequential"]
    spawn, health = floors["spawn_bash"], floors["health"]
    n = spawn["n"]
    rows = [
        *HEADER,
        f"| 1 | floor: asyncio spawn of `/bin/bash -c true` in the client ({n}) | {ms(spawn['median_ms'])} | {ms(spawn['p95_ms'])} | 1x | | |",
        f"| 1 | floor: `GET /health`, keep-alive ({health['n']}) | {ms(health['median_ms'])} | {ms(health['p95_ms'])} | 1x | | |",
    ]
    exec_true, read_small = seq["terminal_exec_true"], seq["file_read_1kb"]
    rows.append(
        f"| 2 | `terminal_exec` `true`, one session ({exec_true['n']}) | {ms(exec_true['median_ms'])} | "
        f"{ms(exec_true['p95_ms'])} | {exec_true['ratio']}x spawn | ≤ {SPAWN_RATIO}x | {met(found, 'exec_ratio')} |"
    )
    rows.append(
        f"| 3 | `file_read` 1 KB, one session ({read_small['n']}) | {ms(read_small['median_ms'])} | "
        f"{ms(read_small['p95_ms'])} | {read_small['ratio']}x /health | ≤ {HEALTH_RATIO}x | {met(found, 'read_ratio')} |"
    )
    policy = results.get("policy")
    if policy:
        share = policy["first_sight_median_us"] / 10 / exec_true["median_ms"] if exec_true["median_ms"] else 0
        rows.append(
            f"| 2b | command policy per call ({policy['rules']} rules, {policy['commands']} commands): first sight of a "
            f"command {policy['first_sight_median_us']} µs (worst {policy['first_sight_max_us']} µs), seen before "
            f"{policy['cached_median_us']} µs; beside `terminal_exec` `true` | {policy['first_sight_median_us']} µs | "
            f"| {share:.1f}% of the call | < {POLICY_LIMIT_US} µs | {met(found, 'policy')} |"
        )
    redaction = results.get("redaction")
    if redaction:
        share = redaction["median_us"] / 10 / exec_true["median_ms"] if exec_true["median_ms"] else 0
        each = ", ".join(f"{name} {cost} µs" for name, cost in redaction["outputs"].items())
        rows.append(
            f"| 2c | a {redaction['output_bytes'] // 1024} KB output made its record's excerpt (kept whole, redacted, "
            f"hashed): {each} | {redaction['median_us']} µs | | {share:.1f}% of `terminal_exec` `true` | | |"
        )
    rows += _recording_rows(results.get("recording"), found)
    for name, case in results.get("executor_hop", {}).items():
        local, remote = case["in_process"], case["executor"]
        mark = f"< {HOP_LIMIT_MS} ms | {met(found, 'hop')}" if name == "file_read_1kb" else "|"
        rows.append(
            f"| 3b | executor hop, {name} ({remote['n']}): in-process {ms(local['median_ms'])}, through the executor's "
            f"socket {ms(remote['median_ms'])} | **+{case['hop_median_ms']:.3f} ms** | {ms(remote['p95_ms'])} | | {mark} |"
        )
    for name, case in results["throughput"].items():
        rows.append(
            f"| 4 | {case['label']} ({case['n']}): {case['mb_per_s']} MB/s, peak memory +{case['peak_growth_mb']} MB, "
            f"result {case['result_bytes'] / 1000:.0f} kB | {ms(case['median_ms'])} | {ms(case['p95_ms'])} | | "
            f"< {MEMORY_LIMIT_MB} MB | {met(found, f'memory_{name}')} |"
        )
    load = results["concurrency"]
    audit, latency = load["audit"], load["latency"]
    errors = ", ".join(f"{kind} {count}" for kind, count in sorted(load["errors"].items())) or "none"
    rows.append(
        f"| 5 | {load['clients']} clients × {load['calls_per_client']} `terminal_exec true`: **{load['calls_per_s']} calls/s**, "
        f"errors: {errors} | {ms(latency['median_ms'])} | {ms(latency['p95_ms'])} | | ≥ {CALLS_PER_S}/s, no errors | "
        f"{combined(found, 'calls_per_s', 'errors')} |"
    )
    rows.append(
        f"| 5 | audit after the load: {audit['records']} records for {audit['records_expected'] // 2} calls, chain "
        f'{"intact" if audit["chain_intact"] else "BROKEN"}, "database is locked" ×{audit["database_locked_in_log"]} | | | | '
        f"2 per call, intact, none | {combined(found, 'two_records', 'chain', 'locked')} |"
    )
    rows += _toolkit_rows(results.get("toolkit"), found)
    admin = results["admin"]
    pages, records = admin["pages"], admin["records"]
    rows.append(
        f"| 6 | audit list page, {records:,} records: first load | {_s(pages['list_first_s'])} | | | < {PAGE_LIMIT_S} s | {met(found, 'list_first')} |"
    )
    warm = pages["list_warm"]
    rows.append(
        f"| 6 | audit list page, warm ({warm['n']}) | {ms(warm['median_ms'])} | {ms(warm['p95_ms'])} | | < {PAGE_LIMIT_S} s | {met(found, 'list_warm')} |"
    )
    for name, label in (
        ("list_filtered", "filtered by tool"), ("list_exit_code", "filtered by exit code (1)"),
        ("list_last_7_days", "filtered by date (last 7 days)"),
        ("list_search", "search (matches)"), ("list_search_no_match", "search matching nothing (newest 200,000 records)"),
        ("list_search_all_no_match", "search matching nothing, all records"), ("list_older_page", f"page {results['sizes']['older_page']}"),
        ("overview", "overview page"),
    ):  # fmt: skip
        page = pages.get(name)
        if page is None:
            continue
        rows.append(
            f"| 6 | {label} (first {ms(page['first_ms'])}) | {ms(page['median_ms'])} | {ms(page['p95_ms'])} | | | |"
        )
    verify = admin["verify"]
    rows.append(
        f"| 6 | `audit_verify`, {verify['records_checked'] or 0:,} records (command: {_s(verify['command_wall_s'])}) | "
        f"{_s(verify['verify_s'])} | | | < {VERIFY_LIMIT_S} s | {met(found, 'verify')} |"
    )
    rows += scale_rows(results.get("scale"), found)
    return "\n".join(rows)


def _recording_rows(recording: dict[str, Any] | None, found: list[dict[str, Any]]) -> list[str]:
    if not recording:
        return []
    on, off = recording["on"], recording["off"]
    return [
        f"| 2e | `terminal_exec` `true`, recording off (`SANDSTORM_RECORDING_MAX_BYTES=0`), one session, a server of "
        f"its own ({off['n']}) | {ms(off['median_ms'])} | {ms(off['p95_ms'])} | 1x | | |",
        f"| 2e | `terminal_exec` `true`, recording on (the default), in turns with the row above ({on['n']}) | "
        f"{ms(on['median_ms'])} | {ms(on['p95_ms'])} | {recording['ratio']}x off | ≤ {recording['limit']:g}x | "
        f"{met(found, 'recording')} |",
    ]


def _toolkit_rows(toolkit: dict[str, Any] | None, found: list[dict[str, Any]]) -> list[str]:
    if not toolkit:
        return []
    edit, grep = toolkit["edit"], toolkit["grep"]
    call, floor = edit["file_edit"], edit["floor"]
    rows = [
        f"| 7 | `file_edit` on a {edit['file_bytes'] / MB:.0f} MB file ({call['n']}; floor: read, rewrite, fsync, rename "
        f"and /health, {ms(floor['median_ms'])}); executor peak +{edit['executor_peak_growth_mb']} MB "
        f"({edit['memory_ratio']}x the file) | {ms(call['median_ms'])} | {ms(call['p95_ms'])} | {edit['time_ratio']}x | "
        f"≤ {edit['time_target']}x, < {edit['memory_target']}x | {combined(found, 'edit_time', 'edit_memory')} |"
    ]
    for name, case in grep["searches"].items():
        call, floor = case["file_grep"], case["floor"]
        rows.append(
            f"| 7 | `file_grep` {name}, {grep['files']:,} files / {grep['tree_mb']} MB ({call['n']}; floor: rg directly "
            f"and /health, {ms(floor['median_ms'])}); peak +{case['peak_growth_mb']} MB | {ms(call['median_ms'])} | "
            f"{ms(call['p95_ms'])} | {case['ratio']}x | ≤ {grep['target_ratio']}x, < {grep['target_memory_mb']} MB | "
            f"{combined(found, f'grep_{name}', f'grep_memory_{name}')} |"
        )
    output = toolkit["output"]
    wake, floor = output["wake"], output["floor"]
    rows.append(
        f"| 7 | `terminal_output` with `wait_ms`: from a background command's line to the answer ({wake['n']}; "
        f"/health beside it {ms(floor['median_ms'])}) | {ms(wake['median_ms'])} | {ms(wake['p95_ms'])} | "
        f"{ratio(wake['median_ms'], floor['median_ms'])}x /health | ≤ {output['target_ms']:g} ms | "
        f"{combined(found, 'output_wake')} |"
    )
    return rows


def machine_line(results: dict[str, Any]) -> str:
    machine = results["machine"]
    return (
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_mb'] or '?'} MB, Python {machine['python']}, "
        f"Linux {machine['kernel']}; load average {machine['load_average_1m']} at the start, "
        f"{machine.get('load_average_1m_end', '?')} at the end"
        + ("; **--quick run** (targets are for the full run)" if results.get("quick") else "")
    )
