"""Starting a recorded background command, and terminal_exec's `background_after`: a command run as a background
command from the start, answered like terminal_exec if it ends in time, carried on (not killed) if it does not."""

from __future__ import annotations

import asyncio
import time

from mcpserver.background import record_cap, record_started_process
from mcpserver.call import ToolCall
from mcpserver.executor.interface import BackgroundStart, ToolFailure
from mcpserver.results import ENVELOPE_BYTES, ToolResult

MAX_BACKGROUND_AFTER = 300.0
PROGRESS_BYTES = 4096
PROGRESS_INTERVAL = 0.25  # seconds between progress notifications, as terminal_exec sends them


async def start_recorded(call: ToolCall, command: str, cwd: str | None, mode: str) -> BackgroundStart:
    started = await call.executor.start_background(command, cwd, mode, record_cap())
    await record_started_process(call.principal, started, command, cwd or "", call.call_id)
    return started


async def run_until_background(call: ToolCall, command: str, cwd: str | None, after: float) -> ToolResult:
    if not after > 0:
        raise ToolFailure("Error: background_after must be a positive number of seconds")
    after = min(after, MAX_BACKGROUND_AFTER)
    begun = time.monotonic()
    started = await start_recorded(call, command, cwd, "none")
    job = (started.log_path, started.pid, started.start_ticks)
    offset, state = 0, "running"
    while state == "running":
        left_ms = int((begun + after - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        if call.wants_progress:
            found = await call.executor.job_output(*job, offset, None, PROGRESS_BYTES, left_ms)
            if found["output"]:
                await call.progress(found["output"])
                offset = found["next_offset"]
                await asyncio.sleep(PROGRESS_INTERVAL)
        else:
            found = await call.executor.job_output(*job, 0, None, 1, left_ms, until_end=True)
        state = found["state"]
    # The output travels twice (text and structured copy), as terminal_exec's does, so each copy gets under half.
    budget = (call.result_cap - 4 * ENVELOPE_BYTES) // 2
    final = await call.executor.job_output(*job, None, budget, budget, 0)
    elapsed = time.monotonic() - begun
    shown = final["output"]
    if final["offset"] > 0:
        shown = f"[first {final['offset']} bytes left out: the whole output is in {started.log_path}]\n{shown}"
    structured = {
        "output": shown,
        "exit_code": final.get("exit_code"),
        "timed_out": False,
        "truncated": final["offset"] > 0,
        "duration_ms": int(elapsed * 1000),
        "background": final["state"] == "running",
        "id": started.pid,
        "output_path": started.log_path,
    }
    if final["state"] == "running":
        text = (
            f"Still running after {after:g}s: carried on as background process {started.pid} (it was not killed).\n"
            f"PID: {started.pid}\nOutput: {started.log_path}\n"
            f"Follow it with terminal_output (id {started.pid}, offset {final['next_offset']}); stop it with "
            "terminal_kill."
        )
        if shown:
            text += f"\n\noutput so far:\n{shown.rstrip(chr(10))}"
        return ToolResult(text, structured=structured)
    if final["state"] == "lost":
        raise ToolFailure(f"Error: background process {started.pid} was lost: its end was not recorded")
    exit_code = final.get("exit_code")
    parts = [f"output:\n{shown.rstrip(chr(10))}"] if shown.strip("\n") else []
    parts.append(f"exit_code: {exit_code}")
    return ToolResult("\n\n".join(parts), exit_code != 0, structured, exit_code=exit_code)
