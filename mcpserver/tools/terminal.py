"""terminal_exec, terminal_exec_background, terminal_kill."""

from __future__ import annotations

from typing import Annotated, Any

from django.conf import settings
from pydantic import Field

from mcpserver.background import find_started_process, record_signal
from mcpserver.call import ToolCall
from mcpserver.executor.interface import ExecResult, ToolFailure
from mcpserver.executor.relay import DEFAULT_CAP
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, ToolOutput, ToolResult
from mcpserver.tools.carry_on import run_until_background, start_recorded

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 300.0
CwdArg = Annotated[str | None, Field(description="Working directory; default the workspace root.")]
# The agent's own words on what a command is for, shown (marked as the agent's) to the people who review and approve
# calls; it changes nothing of what runs.
DescriptionArg = Annotated[
    str | None,
    Field(
        description="Optional: a few words on what this command does and why, shown to the people who review and "
        "approve your calls.",
        max_length=500,
    ),
]
EXIT_CODE = "Its exit status: 0 is success, 124 after a timeout."
CUT = "; when long, its head and tail with a line saying how much was left out."
OUTPUT_PATH = "When output was cut: the file holding all of it (read it with terminal_output, this path as the id)."


class CommandResult(ToolOutput):
    """A finished command (workspace_install's package manager)."""

    stdout: str = Field(description="What it printed on stdout" + CUT)
    stderr: str = Field(description="What it printed on stderr" + CUT)
    exit_code: int = Field(description=EXIT_CODE)
    timed_out: bool = Field(description="It ran past its time limit, and its processes were killed.")
    truncated: bool = Field(description="Its output was cut (see output_path).")
    duration_ms: int
    output_path: str | None = Field(default=None, description=OUTPUT_PATH)


class TerminalExecResult(ToolOutput):
    """terminal_exec's result: a finished command, or with background_after one that may carry on in the background."""

    stdout: str | None = Field(default=None, description="What it printed on stdout" + CUT)
    stderr: str | None = Field(default=None, description="What it printed on stderr" + CUT)
    output: str | None = Field(
        default=None,
        description="With background_after instead of stdout and stderr: both as printed, together (the last part "
        "when long).",
    )
    exit_code: int | None = Field(description=EXIT_CODE + " Null while it still runs in the background.")
    timed_out: bool = Field(description="It ran past its timeout, and its processes were killed.")
    truncated: bool = Field(description="Its output was cut (see output_path).")
    duration_ms: int
    output_path: str | None = Field(default=None, description=OUTPUT_PATH)
    background: bool = Field(
        default=False,
        description="With background_after: still running then, so carried on (not killed) as a background command.",
    )
    id: int | None = Field(
        default=None, description="With background_after: its background command id (PID), for terminal_output."
    )


class BackgroundResult(ToolOutput):
    pid: int = Field(description="Its id (PID), for terminal_output, terminal_input and terminal_kill.")
    output_path: str = Field(description="The log its stdout and stderr go to; read it with terminal_output by pid.")


class KillResult(ToolOutput):
    pid: int
    signal: str = Field(description="The signal sent to its process group: SIGTERM.")


def exec_text(result: ExecResult) -> str:
    """`stdout:`, `stderr:` (each when non-empty, final newline dropped) and `exit_code:`, joined by a blank line."""
    parts = []
    stdout, stderr = result.stdout.rstrip("\n"), result.stderr.rstrip("\n")
    if stdout:
        parts.append(f"stdout:\n{stdout}")
    if stderr:
        parts.append(f"stderr:\n{stderr}")
    parts.append(f"exit_code: {result.exit_code}")
    return "\n\n".join(parts)


def exec_structured(result: ExecResult) -> dict[str, Any]:
    """A finished command's structured copy (CommandResult, TerminalExecResult): its output and facts."""
    structured: dict[str, Any] = {
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "duration_ms": result.duration_ms,
    }
    if result.output_path:
        structured["output_path"] = result.output_path
    return structured


def exec_result(result: ExecResult, timeout: float | None = None) -> ToolResult:
    return ToolResult(
        exec_text(result),
        result.exit_code != 0,
        exec_structured(result),
        exit_code=result.exit_code,
        extra={"timed_out": result.timed_out, "timeout": f"{timeout:g}" if timeout is not None else ""},
    )


def effective_timeout(timeout: float | None) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT
    if timeout <= 0:
        raise ToolFailure("Error: timeout must be a positive number of seconds")
    return min(timeout, MAX_TIMEOUT)


@tool(title="Run a command", destructive=True, open_world=True, output=TerminalExecResult)
async def terminal_exec(
    call: ToolCall,
    command: Annotated[str, Field(description="Run with /bin/bash -c.")],
    cwd: CwdArg = None,
    timeout: Annotated[float | None, Field(description="Seconds; default 30, at most 300.")] = None,
    background_after: Annotated[
        float | None,
        Field(
            description="Seconds: a command still running then is not killed but carried on as a background "
            "command (follow it with terminal_output); timeout then does not apply. Its stdout and stderr come "
            "as one output."
        ),
    ] = None,
    description: DescriptionArg = None,
) -> ToolResult:
    """Run a shell command in the workspace and return its stdout, stderr and exit code.

    Long output is cut in the middle; the whole output is saved to a file the result names (read it with file_read).
    That file is outside the workspace, the caller's alone: read it with terminal_output, giving its path as the id.
    """
    if background_after is not None:
        return await run_until_background(call, command, cwd, background_after)
    # stdout and stderr travel twice (text and structured copy), so each copy gets under half of the cap.
    budget = (call.result_cap - 4 * ENVELOPE_BYTES) // 2
    # Recording off (0): the Live view and progress notifications still follow the output, up to the default cap.
    listen_cap = settings.RECORDING_MAX_BYTES or DEFAULT_CAP
    seconds = effective_timeout(timeout)
    result = await call.executor.run_command(command, cwd, seconds, budget, call.output, listen_cap)
    return exec_result(result, seconds)


@tool(title="Start a background command", destructive=True, open_world=True, output=BackgroundResult)
async def terminal_exec_background(
    call: ToolCall,
    command: Annotated[str, Field(description="Run with /bin/bash -c, detached.")],
    cwd: CwdArg = None,
    stdin: Annotated[bool, Field(description="Keep its stdin open for terminal_input (else /dev/null).")] = False,
    pty: Annotated[
        bool, Field(description="Run it in a pseudo-terminal (for sudo, ssh, REPLs, prompts); implies stdin.")
    ] = False,
    description: DescriptionArg = None,
) -> ToolResult:
    """Start a long-running command detached; its output goes to a log file named in the result."""
    mode = "pty" if pty else "stdin" if stdin else "none"
    started = await start_recorded(call, command, cwd, mode)
    text = f"PID: {started.pid}\nStarted background process {started.pid}\nOutput: {started.log_path}"
    return ToolResult(text, structured={"pid": started.pid, "output_path": started.log_path})


@tool(title="Stop a background command", destructive=True, output=KillResult)
async def terminal_kill(call: ToolCall, pid: int) -> ToolResult:
    """Send SIGTERM to a background process this server started (and its process group).

    Only this user's own; also to what it left running in sessions of their own."""
    ticks = await call.executor.process_start_ticks(pid) if pid > 0 else None
    if ticks is None:
        return ToolResult.error(f"No such process {pid}")
    started = await find_started_process(pid, ticks)
    if started is None:
        return ToolResult.error(f"Process {pid} was not started by this server")
    if started.username != call.principal.username:  # a job is its user's, as terminal_output and terminal_input say
        return ToolResult.error(f"Process {pid} was not started by {call.principal.username}")
    if not await call.executor.end_job(started.log_path, pid, ticks, escalate=False):
        return ToolResult.error(f"No such process {pid}")
    await record_signal(started)
    return ToolResult(f"Sent SIGTERM to {pid}", structured={"pid": pid, "signal": "SIGTERM"})
