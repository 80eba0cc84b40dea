"""The executor interface: all OS work the tools do (files, processes, git) goes through it.

It takes plain data and returns plain data (strings, numbers, dataclasses of them), never Django objects: it runs
in a separate process as the agent user, reached over a Unix socket (service.py, remote.py). It knows nothing of
the database, settings, tokens or the audit log.

The operations are declared once, as the methods of `Executor`: LocalExecutor implements them (mypy checks each
implementation's signature against its declaration), RemoteExecutor forwards each over the socket without a body
of its own, and the executor's service answers exactly `OPERATIONS`, nothing else of the object it serves.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


class ExecutorError(Exception):
    """A call to the executor did not return a result: a ToolFailure, or (remote.py) ExecutorLost or ExecutorFault."""


class ToolFailure(ExecutorError):
    """An expected failure of a tool. Its message is the text the agent sees (it starts with "Error: ")."""


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one finished command.

    `stdout`/`stderr` hold at most the byte budget given to the call (head and tail kept, with a marker line
    where the middle was left out). When either stream was cut, the whole output is in `output_path`.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_ms: int
    output_path: str | None
    stdout_bytes: int
    stderr_bytes: int


@dataclass(frozen=True)
class BackgroundStart:
    pid: int
    pgid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: with the pid, it names one process for its whole life
    log_path: str


# A piece of a command's output: (seconds since it started, "o" stdout / "e" stderr / "m" a note, its text).
OutputEvent = tuple[float, str, str]
DEFAULT_RECORD_CAP = 16 * 1024 * 1024  # bytes of a command's output its recording keeps (past it, head and tail)
# Called with the output that came since the last call, in order, while a command runs and once it has ended
# (relay.py): for the call's recording, the console's Live view and progress notifications.
OutputListener = Callable[[list[OutputEvent]], Awaitable[None]]


class Executor:
    """The executor's operations. Each body here only declares it: LocalExecutor and RemoteExecutor implement them."""

    root: str

    # --- files ---------------------------------------------------------------------------------------------------
    async def read_file(
        self, path: str, offset: int | None, limit: int | None, max_bytes: int, line_numbers: bool = False
    ) -> str:
        raise NotImplementedError

    async def write_file(self, path: str, content: str) -> str:
        raise NotImplementedError

    async def delete_file(self, path: str) -> str:
        raise NotImplementedError

    async def list_dir(self, path: str, recursive: bool) -> str:
        raise NotImplementedError

    async def move(self, source: str, dest: str) -> str:
        raise NotImplementedError

    async def mkdir(self, path: str) -> str:
        raise NotImplementedError

    # --- processes -----------------------------------------------------------------------------------------------
    async def run_command(
        self,
        command: str,
        cwd: str | None,
        timeout: float,
        output_budget: int,
        listener: OutputListener | None,
        listen_max_bytes: int = DEFAULT_RECORD_CAP,
    ) -> ExecResult:
        """`listener` gets the whole output as it comes, up to `listen_max_bytes` (past it, its head and tail)."""
        raise NotImplementedError

    async def start_background(
        self, command: str, cwd: str | None, mode: str = "none", record_cap: int = DEFAULT_RECORD_CAP
    ) -> BackgroundStart:
        """The job's host records its output and input, at most `record_cap` bytes of output (head and tail)."""
        raise NotImplementedError

    async def process_start_ticks(self, pid: int) -> int | None:
        raise NotImplementedError

    async def job_output(
        self,
        log_path: str,
        pid: int,
        start_ticks: int,
        offset: int | None,
        tail: int | None,
        max_bytes: int,
        wait_ms: int,
        until_end: bool = False,
    ) -> dict[str, Any]:
        raise NotImplementedError

    async def job_states(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def job_events(
        self, log_path: str, pid: int, start_ticks: int, offset: int, max_bytes: int = 1024 * 1024
    ) -> dict[str, Any]:
        """A page of a job's recording: {events: [[t, code, text]...], next_offset, done, recorded, state,
        exit_code}; `done` once nothing more will come."""
        raise NotImplementedError

    async def read_saved_output(
        self, name: str, offset: int | None, tail: int | None, max_bytes: int
    ) -> dict[str, Any]:
        """A page of the saved output a cut result named: {size, offset, next_offset, output}."""
        raise NotImplementedError

    async def job_input(self, log_path: str, pid: int, start_ticks: int, text: str, eof: bool) -> dict[str, Any]:
        raise NotImplementedError

    async def signal_group(self, pid: int, pgid: int, start_ticks: int, signum: int) -> bool:
        raise NotImplementedError

    async def end_job(self, log_path: str, pid: int, start_ticks: int, escalate: bool = True) -> bool:
        """The job's command group and all its host adopted: SIGTERM, then (`escalate`) SIGKILL until none is left."""
        raise NotImplementedError

    async def end_credentials(self, keys: list[str], prefixes: list[str], before: float) -> list[dict[str, Any]]:
        """Revocation: kill every process that calls of these credentials (principal keys, or keys starting with a
        prefix) started up to `before` (seconds since the epoch) and that is still running, wherever it went
        (credential_groups.py). What was killed: [{pid, command}]; none where the executor cannot track them."""
        raise NotImplementedError

    # --- git -----------------------------------------------------------------------------------------------------
    async def git_clone(self, repo_url: str, path: str | None, branch: str | None) -> str:
        raise NotImplementedError

    async def git_status(self, path: str | None) -> str:
        raise NotImplementedError

    async def git_commit(self, message: str, path: str | None) -> str:
        raise NotImplementedError

    async def git_push(self, remote: str | None, branch: str | None, path: str | None) -> str:
        raise NotImplementedError

    async def git_pull(self, remote: str | None, branch: str | None, path: str | None) -> str:
        raise NotImplementedError

    async def git_branch(self, name: str | None, path: str | None) -> str:
        raise NotImplementedError

    async def git_checkout(self, branch: str, path: str | None) -> str:
        raise NotImplementedError

    async def git_diff(self, path: str | None) -> str:
        raise NotImplementedError

    async def git_log(self, n: int, path: str | None) -> str:
        raise NotImplementedError

    # --- workspace -----------------------------------------------------------------------------------------------
    async def workspace_info(self) -> str:
        raise NotImplementedError

    async def install(self, packages: list[str], manager: str) -> ExecResult:
        raise NotImplementedError

    async def git_roots(self) -> list[str]:
        raise NotImplementedError

    # --- reads ---------------------------------------------------------------------------------------------------
    async def read_file_or_image(
        self,
        path: str,
        offset: int | None,
        limit: int | None,
        max_bytes: int,
        line_numbers: bool,
        image_max_bytes: int,
    ) -> dict[str, Any]:
        """file_read's one call: {"image": {path, mime, size, data}} for a PNG, JPEG, GIF or WebP file (known by its
        first bytes; `data` its base64, or None past `image_max_bytes`), else {"text": what read_file returns}."""
        raise NotImplementedError

    # --- edits (file_edit, file_multi_edit) ----------------------------------------------------------------------
    async def edit_file(self, path: str, edits: list[dict[str, Any]], result_budget: int) -> dict[str, Any]:
        """Apply `edits` ({old_string, new_string, replace_all}) in order, all or nothing, and replace the file
        atomically; {"path", "diff" (within result_budget JSON bytes), "replacements", "diff_truncated"}."""
        raise NotImplementedError

    # --- patches (apply_patch) ----------------------------------------------------------------------------------
    async def apply_patch(self, patch: str, result_budget: int) -> dict[str, Any]:
        """Apply a patch in Codex's format (patch.py) to the workspace, all files or none (patching.py): {"files":
        [{action, path, moved_from?, added_lines, removed_lines}], "text" (a line per file and the unified diff,
        within result_budget JSON bytes beside the files' list), "diff_truncated"}."""
        raise NotImplementedError

    # --- search (file_grep, file_glob) ---------------------------------------------------------------------------
    async def grep(
        self,
        pattern: str,
        path: str | None,
        glob: str | None,
        type: str | None,
        output_mode: str,
        case_insensitive: bool,
        line_numbers: bool,
        context_before: int | None,
        context_after: int | None,
        multiline: bool,
        head_limit: int | None,
        offset: int,
        max_bytes: int,
    ) -> dict[str, Any]:
        """ripgrep in the directory `path`: {"entries" (lines, files or `file:count`, from `offset`), "total",
        "offset", "next_offset" (None at the end), "output_cut", and "matches" in count mode}."""
        raise NotImplementedError

    async def glob_files(self, pattern: str, path: str | None, max_bytes: int) -> dict[str, Any]:
        """The files under `path` matching `pattern`, newest first, in the shape `grep` answers."""
        raise NotImplementedError

    # --- maintenance (not a tool) --------------------------------------------------------------------------------
    async def prune_output(self, max_bytes: int | None = None) -> str:
        raise NotImplementedError


def _declared(cls: type) -> frozenset[str]:
    return frozenset(name for name, member in vars(cls).items() if inspect.iscoroutinefunction(member))


# The requests the executor answers (besides `ping`, its liveness check): Executor's methods.
OPERATIONS = _declared(Executor)
