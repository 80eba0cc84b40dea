"""What recording costs a call (line 2e, docs/performance.md): `terminal_exec true` on two servers on copies of the
same database, one recording calls (the default), one with SANDSTORM_RECORDING_MAX_BYTES=0 (recording off), one
session each, BATCH calls at a time in turns (as sections 1 to 3), so both span the same stretch of the run. The
ratio of the medians, on / off, may be at most 1.10 (the issue's "within 10%")."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from pathlib import Path
from typing import Any

from bench.client import McpSession, result_text
from bench.sections import TRUE, Sizes, connection, timed_in_turns
from bench.server import SERVER_SETTINGS, BenchServer, start_server
from bench.stats import summary

LIMIT = 1.10
SERVERS = {"on": {}, "off": {"SANDSTORM_RECORDING_MAX_BYTES": "0"}}  # label: its settings beside the bench's


def measure(sizes: Sizes, base: Path, root: Path) -> dict[str, Any]:
    """Both servers on copies of `base` (the migrated state dir), measured in turns, then stopped."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for label, overrides in SERVERS.items():
            server = start_server(root / label, base, {**SERVER_SETTINGS, **overrides})
            stack.callback(server.stop)
            servers[label] = server
        return asyncio.run(_on_and_off(servers, sizes))


async def _on_and_off(servers: dict[str, BenchServer], sizes: Sizes) -> dict[str, Any]:
    sessions = {label: McpSession(connection(server), server.token) for label, server in servers.items()}
    try:
        for label, server in servers.items():
            await _check_recording(server, on=label == "on")
            await sessions[label].start()
            answer = result_text(await sessions[label].call("terminal_exec", TRUE))
            if "exit_code: 0" not in answer:
                raise AssertionError(f"terminal_exec answered {answer[:200]!r}")
        runs = {label: functools.partial(session.call, "terminal_exec", TRUE) for label, session in sessions.items()}
        durations = await timed_in_turns(runs, sizes)
    finally:
        for session in sessions.values():
            await session.close()
    on, off = summary(durations["on"]), summary(durations["off"])
    ratio = round(on["median_ms"] / off["median_ms"], 3) if on["median_ms"] and off["median_ms"] else None
    # `true` prints nothing, so neither server writes a file: the figure is what recording costs every call.
    files = {label: _recording_files(server) for label, server in servers.items()}
    return {"on": on, "off": off, "ratio": ratio, "limit": LIMIT, "within_limit": ratio is not None and ratio <= LIMIT,
            "recording_files": files}  # fmt: skip


async def _check_recording(server: BenchServer, on: bool) -> None:
    """That the server records calls, or not, as its settings say (its /health's `recordings.on`)."""
    http = connection(server)
    try:
        response = await http.request("GET", "/health", {})
    finally:
        await http.close()
    found = json.loads(response.body)["recordings"].get("on")
    if found is not on:
        raise AssertionError(f"the server with recording {'on' if on else 'off'} says recordings.on = {found!r}")


def _recording_files(server: BenchServer) -> int:
    directory = server.state_dir / "recordings"
    return sum(1 for path in directory.rglob("*") if path.is_file()) if directory.is_dir() else 0
