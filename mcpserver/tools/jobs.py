"""terminal_output, terminal_list, terminal_input: following the background commands terminal_exec_background
(and terminal_exec's `background_after`) started. A command's id is its pid, as terminal_exec_background says."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import UTC
from typing import Annotated, Any

from pydantic import Field

from mcpserver.approvals.following import NotRunning, held_requests, is_label, job_of_request
from mcpserver.approvals.requests import summary_of
from mcpserver.background import find_job, job_ref, jobs_of
from mcpserver.call import ToolCall
from mcpserver.executor.interface import ToolFailure
from mcpserver.models import APPROVAL_APPROVED, APPROVAL_PENDING, ApprovalRequest, BackgroundProcess
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, ToolOutput, ToolResult

DEFAULT_MAX_BYTES = 64 * 1024
MAX_WAIT_MS = 50_000  # under the ~60 s a client such as Claude.ai allows one call
WAIT_SLICE_MS = 5_000  # a progress notification between slices keeps the client's patience
LIST_LIMIT = 100

JobId = Annotated[
    int | str,
    Field(
        description="The background command's id: the PID terminal_exec_background gave, or the approval request "
        '("R-17") of a command that waited for approval; or the file a cut terminal_exec result saved its whole '
        "output to."
    ),
]
SAVED_NAME = re.compile(r"[a-z]+-\d{8}-\d{6}-[0-9a-f]{32}\.(stdout|stderr)\.log")  # the executor checks it again


class OutputResult(ToolOutput):
    id: int | str
    state: str = Field(
        description="running, exited, killed or lost; for an approval request not run (yet): pending_approval, "
        "denied, timed_out, cancelled or not_started; saved for a terminal_exec result's saved output."
    )
    exit_code: int | None = Field(description="Once it has ended: its exit code (128+N when killed by signal N).")
    waiting_for_input: bool = Field(description="It is blocked reading its stdin or terminal.")
    offset: int = Field(description="The byte offset of the output shown.")
    next_offset: int = Field(description="Pass this as offset to read on.")
    size: int = Field(description="Bytes of output so far.")
    log_path: str


class ListedCommand(ToolOutput):
    id: int | str
    command: str
    cwd: str
    started_at: str
    state: str
    exit_code: int | None
    output_bytes: int
    waiting_for_input: bool
    input: str = Field(description="none, stdin or pty.")


class ListResult(ToolOutput):
    commands: list[ListedCommand]
    more: int = Field(description="Older commands not listed.")


class InputResult(ToolOutput):
    id: int | str
    written: int = Field(description="Bytes passed on to the command.")
    eof: bool
    state: str
    waiting_for_input: bool


def state_text(described: dict[str, Any]) -> str:
    """A job's state as a person reads it: `running (waiting for input)`, `exited with code 1`, ..."""
    state = described["state"]
    if state == "running":
        return "running (waiting for input)" if described.get("waiting_for_input") else "running"
    if state == "exited":
        return f"exited with code {described['exit_code']}"
    if state == "killed":
        number = described.get("signal") or 0
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name} (exit code {described['exit_code']})"
    return "lost: it is no longer running and its end was not recorded (the machine restarted, or it was killed with its job host)"


async def _job(call: ToolCall, id: int | str, wait_ms: int = 0) -> BackgroundProcess | NotRunning:
    if is_label(id):
        return await job_of_request(call.principal, str(id), wait_ms)
    if isinstance(id, str) and not id.strip().isdigit():
        raise ToolFailure(f'Error: {id!r} is not a background command id (a PID, or a request such as "R-17")')
    job = await find_job(call.principal, int(id))
    if job is None:
        raise ToolFailure(f"Error: no background command {id} was started by {call.principal.username}")
    return job


async def _running_job(call: ToolCall, id: int | str) -> BackgroundProcess:
    job = await _job(call, id)
    if isinstance(job, NotRunning):
        raise ToolFailure(job.text if job.is_error else f"Error: {job.text}")
    return job


def _not_running_result(job: NotRunning) -> ToolResult:
    structured = {
        "id": job.label,
        "state": job.state,
        "exit_code": None,
        "waiting_for_input": False,
        "offset": 0,
        "next_offset": 0,
        "size": 0,
        "log_path": "",
    }
    return ToolResult(job.text, is_error=job.is_error, structured=None if job.is_error else structured)


@tool(title="Read a background command's output", read_only=True, output=OutputResult)
async def terminal_output(
    call: ToolCall,
    id: JobId,
    offset: Annotated[int | None, Field(description="Read from this byte offset (a previous next_offset).")] = None,
    tail: Annotated[int | None, Field(description="Instead of offset: the last this many bytes.")] = None,
    max_bytes: Annotated[int | None, Field(description="At most this many bytes of output (default 64 KiB).")] = None,
    wait_ms: Annotated[
        int | None, Field(description="Wait up to this long (at most 50000) for output past offset, or the end.")
    ] = None,
) -> ToolResult:
    """A background command's output (stdout and stderr together) from a byte offset, its state (running,
    exited with its code, killed, or lost) and the offset to read on from. With wait_ms, the call returns as soon
    as there is new output, the command ends, or it waits for input (answer it with terminal_input)."""
    if offset is not None and tail is not None:
        raise ToolFailure("Error: give offset or tail, not both")
    if (offset or 0) < 0 or (tail is not None and tail <= 0) or (max_bytes is not None and max_bytes <= 0):
        raise ToolFailure("Error: offset must be 0 or more; tail and max_bytes more than 0")
    if wait_ms is not None and wait_ms < 0:
        raise ToolFailure("Error: wait_ms must be 0 or more")
    budget = min(max_bytes or DEFAULT_MAX_BYTES, call.result_cap - 4 * ENVELOPE_BYTES)
    if isinstance(id, str) and SAVED_NAME.fullmatch(os.path.basename(id.strip())):
        return await _saved_output_result(call, os.path.basename(id.strip()), offset, tail, budget)
    remaining = min(wait_ms or 0, MAX_WAIT_MS)
    started = time.monotonic()
    job = await _job(call, id, remaining)
    if isinstance(job, NotRunning):
        return _not_running_result(job)
    remaining = max(0, remaining - int((time.monotonic() - started) * 1000))
    while True:
        this_wait = min(remaining, WAIT_SLICE_MS)
        found = await call.executor.job_output(job.log_path, job.pid, job.start_ticks, offset, tail, budget, this_wait)
        remaining -= this_wait
        if found["output"] or found["state"] != "running" or found["waiting_for_input"] or remaining <= 0:
            break
        offset, tail = found["next_offset"], None
        await call.progress(f"{id} is {state_text(found)}; no new output after {time.monotonic() - started:.0f}s")
    return _output_result(id, job, found)


async def _saved_output_result(
    call: ToolCall, name: str, offset: int | None, tail: int | None, budget: int
) -> ToolResult:
    """A page of the output a cut terminal_exec result saved (it names the file: its name is the id)."""
    found = await call.executor.read_saved_output(name, offset, tail, budget)
    size, start, end = found["size"], found["offset"], found["next_offset"]
    where = f"Output bytes {start}-{end} of {size}; next offset {end}"
    if size > end:
        where += f" ({size - end} more bytes: call again with offset {end})"
    structured = {
        "id": name, "state": "saved", "exit_code": None, "waiting_for_input": False,
        "offset": start, "next_offset": end, "size": size, "log_path": "",
    }  # fmt: skip
    header = f"Saved output {name}\n{where}."
    return ToolResult(f"{header}\n\n{found['output']}" if found["output"] else header, structured=structured)


def _output_result(id: int | str, job: BackgroundProcess, found: dict[str, Any]) -> ToolResult:
    size, start, end = found["size"], found["offset"], found["next_offset"]
    left = size - end
    where = f"Output bytes {start}-{end} of {size}; next offset {end}"
    if left > 0:
        where += f" ({left} more bytes: call again with offset {end})"
    header = f"Background command {id}: {state_text(found)}\n{where}."
    structured = {
        "id": id,
        "state": found["state"],
        "exit_code": found.get("exit_code"),
        "waiting_for_input": found["waiting_for_input"],
        "offset": start,
        "next_offset": end,
        "size": size,
        "log_path": job.log_path,
    }
    text = f"{header}\n\n{found['output']}" if found["output"] else header
    return ToolResult(text, structured=structured)


@tool(title="List background commands", read_only=True, output=ListResult)
async def terminal_list(call: ToolCall) -> ToolResult:
    """The background commands this user started (newest first, at most 100): id, command, start time, state,
    exit code and output size."""
    rows, total = await jobs_of(call.principal.username, LIST_LIMIT)
    states = await call.executor.job_states([job_ref(row) for row in rows]) if rows else []
    held = [_not_running_of(request) for request in await held_requests(call.principal, LIST_LIMIT)]
    listed = held + [_listed(row, state) for row, state in zip(rows, states, strict=True)]
    if not listed:
        return ToolResult(
            f"No background commands started by {call.principal.username}.", structured={"commands": [], "more": 0}
        )
    lines = [f"{len(listed)} background commands of {total + len(held)} (newest first):"]
    for entry in held:
        lines.append(f"{entry['id']}  {entry['state'].replace('_', ' ')}\n    {_one_line(entry['command'])}")
    for row, state in zip(rows, states, strict=True):
        mode = state.get("mode", "none")
        lines.append(
            f"{row.pid}  {state_text(state)}  started {_utc(row)}  {state['size']} bytes"
            + (f"  ({mode})" if mode != "none" else "")
            + f"\n    {_one_line(row.command)}"
        )
    return ToolResult("\n".join(lines), structured={"commands": listed, "more": total - len(listed)})


def _not_running_of(request: ApprovalRequest) -> dict[str, Any]:
    """A held call's request as terminal_list shows it until it runs (then it is listed by its PID)."""
    state = "pending_approval" if request.state == APPROVAL_PENDING else request.state
    if request.state == APPROVAL_APPROVED:
        state = "not_started"
    return {
        "id": request.label,
        "command": summary_of(request.tool, request.arguments)[:1000],
        "cwd": request.cwd,
        "started_at": request.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "state": state,
        "exit_code": None,
        "output_bytes": 0,
        "waiting_for_input": False,
        "input": "none",
    }


def _listed(row: BackgroundProcess, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row.pid,
        "command": row.command[:1000],
        "cwd": row.cwd,
        "started_at": _utc(row),
        "state": state["state"],
        "exit_code": state.get("exit_code"),
        "output_bytes": state["size"],
        "waiting_for_input": state["waiting_for_input"],
        "input": state.get("mode", "none"),
    }


def _utc(row: BackgroundProcess) -> str:
    return row.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _one_line(command: str) -> str:
    flat = " ".join(command.split())
    return flat if len(flat) <= 200 else flat[:199] + "…"


@tool(title="Type into a background command", destructive=True, open_world=True, output=InputResult)
async def terminal_input(
    call: ToolCall,
    id: JobId,
    text: Annotated[
        str,
        Field(
            description="Written to the command's stdin (or terminal) as is: end a line with \\n; control keys as "
            "characters (\\u0003 is Ctrl-C, \\u0004 Ctrl-D)."
        ),
    ],
    eof: Annotated[bool, Field(description="Then close its input (on a terminal: Ctrl-D).")] = False,
) -> ToolResult:
    """Write to the stdin of a background command started with stdin (or pty) true. Recorded in the audit log like
    every argument: do not type secrets an administrator must not read. Text typed into a shell or interpreter is
    decided by the command policy like a command, before it is written: type whole lines, ending with a newline."""
    job = await _running_job(call, id)
    found = await call.executor.job_input(job.log_path, job.pid, job.start_ticks, text, eof)
    closed = " and closed its input" if eof else ""
    message = f"Wrote {found['written']} bytes to background command {id}{closed}. It is {state_text(found)}."
    structured = {
        "id": id,
        "written": found["written"],
        "eof": eof,
        "state": found["state"],
        "waiting_for_input": found["waiting_for_input"],
    }
    return ToolResult(message + " Read its output with terminal_output.", structured=structured)
