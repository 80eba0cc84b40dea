"""What kernel confinement costs a call (docs/performance.md): `terminal_exec true` of a `workspace` credential
beside a `host` one on the same server, and `git status` started in the read sandbox beside the same start
unconfined, in the executor's own code, in turns. Each ratio may be at most 1.15 (issue 31)."""

from __future__ import annotations

import functools
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.client import McpSession, result_text
from bench.sections import TRUE, Sizes, connection, timed_in_turns
from bench.server import BenchServer
from bench.stats import summary
from mcpserver.executor import confinement
from mcpserver.executor.local import LocalExecutor

LIMIT = 1.15


async def measure(server: BenchServer, sizes: Sizes) -> dict[str, Any]:
    calls = await _terminal_exec(server, sizes)
    git = await _git_status(sizes)
    return {"limit": LIMIT, "terminal_exec_true": calls, "git_status": git}


def _ratio(durations: dict[str, list[float]], confined: str, unconfined: str) -> dict[str, Any]:
    summaries = {name: summary(values) for name, values in durations.items()}
    ratio = round(summaries[confined]["median_ms"] / summaries[unconfined]["median_ms"], 3)
    return {**summaries, "ratio": ratio, "within_limit": ratio <= LIMIT}


async def _terminal_exec(server: BenchServer, sizes: Sizes) -> dict[str, Any]:
    tokens = {
        profile: server.manage("create_token", f"bench-{profile}", "--confinement", profile).stdout.split()[-1]
        for profile in (confinement.WORKSPACE, confinement.HOST)
    }
    sessions = {profile: McpSession(connection(server), token) for profile, token in tokens.items()}
    try:
        for session in sessions.values():
            await session.start()
            answer = result_text(await session.call("terminal_exec", TRUE))
            if "exit_code: 0" not in answer:
                raise AssertionError(f"terminal_exec answered {answer[:200]!r}")
        runs = {
            profile: functools.partial(session.call, "terminal_exec", TRUE) for profile, session in sessions.items()
        }
        return _ratio(await timed_in_turns(runs, sizes), confinement.WORKSPACE, confinement.HOST)
    finally:
        for session in sessions.values():
            await session.close()


async def _git_status(sizes: Sizes) -> dict[str, Any]:
    """LocalExecutor.git_status with its processes started in the read sandbox, and with none (as before it)."""
    with tempfile.TemporaryDirectory(prefix="bench-confinement-") as scratch:
        root = Path(scratch)
        subprocess.run(["git", "init", "-q", str(root / "repo")], check=True)
        (root / "repo" / "a.txt").write_text("a\n")
        sandboxes = confinement.build(str(root), [])
        confinement.configure(sandboxes)
        executor = LocalExecutor(str(root))

        def status(profile: str) -> Any:
            async def run() -> None:
                confinement.PROFILE.set(profile)
                await executor.git_status("repo")

            return run

        try:
            runs = {"read_sandbox": status(confinement.READ), "unconfined": status(confinement.HOST)}
            started = time.perf_counter()
            durations = await timed_in_turns(runs, sizes)
            result = _ratio(durations, "read_sandbox", "unconfined")
            result["seconds"] = round(time.perf_counter() - started, 1)
            return result
        finally:
            sandboxes.close()
