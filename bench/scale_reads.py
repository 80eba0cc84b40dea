"""Section 8, figure 4: `file_read` of 1 KB with its two audit records committed together after the read (the
default) against its started record committed before the read (SANDSTORM_AUDIT_READS_BEFORE=1, the path every call
took before issue 20). Two servers on copies of the same database, one session each, BATCH calls at a time in turns
(as sections 1 to 3), so both span the same stretch of the run. On SQLite (the bench's default), and again on
PostgreSQL when the bench has a DATABASE_URL (each server a database of its own), where a commit waits for the disk."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path
from typing import Any

from bench import sections
from bench.client import McpSession, result_text
from bench.scale_sizes import ONE_SERVER, ScaleSizes
from bench.scale_workers import bench_server, postgres_database
from bench.server import SERVER_SETTINGS, BenchServer, log, start_server
from bench.stats import summary
from tests.live import make_server

PATHS = {"after": "0", "before": "1"}  # label: SANDSTORM_AUDIT_READS_BEFORE


def reads_figure(sizes: sections.Sizes, scale: ScaleSizes, base: Path, root: Path, postgres_url: str) -> dict[str, Any]:
    """SQLite's figure, with PostgreSQL's under "postgresql" (or why it was not measured)."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for label, before in PATHS.items():
            server = start_server(root / label, base, {**SERVER_SETTINGS, "SANDSTORM_AUDIT_READS_BEFORE": before})
            stack.callback(server.stop)
            servers[label] = server
        found = asyncio.run(reads_in_turn(servers, sizes, scale))
    _log("SQLite", found)
    found["postgresql"] = _on_postgres(sizes, scale, root / "postgresql", postgres_url)
    return found


def _on_postgres(sizes: sections.Sizes, scale: ScaleSizes, root: Path, postgres_url: str) -> dict[str, Any]:
    if not postgres_url:
        return {"skipped": "no DATABASE_URL (PostgreSQL)"}
    with contextlib.ExitStack() as stack:
        servers = {}
        for label, before in PATHS.items():
            database = stack.enter_context(postgres_database(postgres_url))  # dropped after its server stopped
            server = make_server(
                root / label, DATABASE_URL=database, SANDSTORM_AUDIT_READS_BEFORE=before, **SERVER_SETTINGS
            )
            server.manage("migrate")
            server.start()
            stack.callback(server.stop)
            servers[label] = bench_server(server)
        found = asyncio.run(reads_in_turn(servers, sizes, scale))
    found["server"] = "one server, PostgreSQL, Daphne on TCP without Caddy"
    _log("PostgreSQL", found)
    return found


def _log(database: str, found: dict[str, Any]) -> None:
    log(
        f"bench: scale: file_read 1 KB on {database}, records after the read {found['after']['median_ms']} ms, "
        f"started record before it {found['before']['median_ms']} ms: {found['ratio']}x"
    )


async def reads_in_turn(servers: dict[str, BenchServer], sizes: sections.Sizes, scale: ScaleSizes) -> dict[str, Any]:
    sessions = {label: McpSession(sections.connection(server), server.token) for label, server in servers.items()}
    try:
        reads = {}
        for label, server in servers.items():
            sections.workspace_file(server, "bench-1kb.txt", 1024)
            await sessions[label].start()
            reads[label] = functools.partial(sessions[label].call, "file_read", {"path": "bench-1kb.txt"})
            first = result_text(await reads[label]())
            if "xxxx" not in first:
                raise AssertionError(f"file_read answered {first[:200]!r}")
            await sections.timed(reads[label], sizes.warmup)
        durations: dict[str, list[float]] = {label: [] for label in servers}
        labels = list(servers)
        for turn in range(-(-scale.reads_compared // sections.BATCH)):
            count = min(sections.BATCH, scale.reads_compared - turn * sections.BATCH)
            for label in sections.in_turn(labels, turn):
                await asyncio.sleep(sections.SETTLE)
                durations[label] += await sections.timed(reads[label], count)
    finally:
        for session in sessions.values():
            await session.close()
    after, before = summary(durations["after"]), summary(durations["before"])
    ratio = round(after["median_ms"] / before["median_ms"], 3) if after["median_ms"] and before["median_ms"] else None
    return {"after": after, "before": before, "ratio": ratio, "server": ONE_SERVER}
