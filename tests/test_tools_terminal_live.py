"""terminal_exec, terminal_exec_background and terminal_kill over MCP against the live server.

Besides each tool's result texts: bounded memory for huge output, progress notifications, no process left behind
by a cancelled call or a vanished client, background output kept in a log, and kill limited to our own processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import Client

from tests.live import LiveServer, apoll, live_group_members, live_pids_with, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

RESULT_CAP = 262144
PROCESS_DEADLINE = 15.0  # SIGTERM, then SIGKILL after 2 s: well within this


def end_group(pgid: int) -> None:
    """Clean-up for a process group this test had the server start, should the server have left it running."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- terminal_exec ---------------------------------------------------------------------------------------------------


async def test_terminal_exec_returns_stdout_and_exit_code_0(tools_client: Client) -> None:
    result = await tools_client.call_tool("terminal_exec", {"command": "echo hello; echo world"})
    assert text_of(result) == "stdout:\nhello\nworld\n\nexit_code: 0"
    assert not result.is_error


async def test_terminal_exec_with_a_non_zero_exit_is_an_error_result_with_both_streams(tools_client: Client) -> None:
    result = await tools_client.call_tool("terminal_exec", {"command": "echo out; echo err >&2; exit 3"})
    assert text_of(result) == "stdout:\nout\n\nstderr:\nerr\n\nexit_code: 3"
    assert result.is_error


async def test_terminal_exec_runs_in_cwd_and_refuses_a_cwd_outside_the_workspace(
    tools_client: Client, workspace_dir: Path, tmp_path: Path
) -> None:
    result = await tools_client.call_tool("terminal_exec", {"command": "pwd", "cwd": workspace_dir.name})
    assert text_of(result) == f"stdout:\n{workspace_dir}\n\nexit_code: 0"
    result = await tools_client.call_tool("terminal_exec", {"command": "touch here", "cwd": str(tmp_path)})
    assert result.is_error and "is outside the allowed directory" in text_of(result)
    assert not (tmp_path / "here").exists()


async def test_terminal_exec_timeout_kills_the_command_and_reports_exit_code_124(tools_client: Client) -> None:
    marker = uuid.uuid4().hex
    result = await tools_client.call_tool("terminal_exec", {"command": f"sleep 60; echo {marker}", "timeout": 0.5})
    assert text_of(result) == "stderr:\ntimeout after 0.5s\n\nexit_code: 124"
    assert result.is_error
    assert live_pids_with(marker) == []


class PeakRss:
    """Samples a process's resident set size in a thread (so the event loop's work does not delay the samples)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.baseline = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


async def test_200_mb_of_output_keeps_server_memory_flat_and_the_capped_result_names_the_full_output(
    tools_client: Client, live_server: LiveServer
) -> None:
    assert live_server.process is not None  # `manage.py serve` execs daphne: this pid is the server itself
    command = "head -c 200000000 /dev/zero | tr '\\0' a"
    with PeakRss(live_server.process.pid) as rss:
        result = await tools_client.call_tool("terminal_exec", {"command": command, "timeout": 120})
    assert rss.peak - rss.baseline < 50 * 1024 * 1024, f"server RSS grew by {(rss.peak - rss.baseline) >> 20} MiB"

    text = text_of(result)
    assert not result.is_error and len(result.model_dump_json(by_alias=True).encode()) < RESULT_CAP
    assert text.startswith("stdout:\naaaa") and text.endswith("aaaa\n\nexit_code: 0")
    where = re.search(r"\n\[\.\.\. (\d+) bytes omitted; the whole stdout is in (\S+)\]\n", text)
    assert where is not None, "the result says how much was left out and where the rest is"
    spill = Path(where[2])
    assert (
        spill.parent == live_server.state_dir / "output"
    )  # the executor's: no tool reaches it, terminal_output pages it
    assert spill.stat().st_size == 200_000_000
    assert result.structured_content is not None and result.structured_content["output_path"] == str(spill)
    page = await tools_client.call_tool("terminal_output", {"id": str(spill), "offset": 199_999_990, "max_bytes": 100})
    assert (
        text_of(page)
        == f"Saved output {spill.name}\nOutput bytes 199999990-200000000 of 200000000; next offset 200000000.\n\naaaaaaaaaa"
    )
    refused = await tools_client.call_tool("file_delete", {"path": str(spill)})
    assert refused.is_error and "is outside the allowed directory" in text_of(refused)
    spill.unlink()


async def test_terminal_exec_sends_small_progress_notifications_while_it_runs(tools_client: Client) -> None:
    notes: list[tuple[float, float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((time.monotonic(), progress, message))

    command = "for i in 1 2 3 4; do echo line$i; sleep 0.5; done"
    result = await tools_client.call_tool("terminal_exec", {"command": command}, progress_callback=on_progress)
    finished = time.monotonic()
    assert text_of(result) == "stdout:\nline1\nline2\nline3\nline4\n\nexit_code: 0"
    assert len(notes) >= 3, notes
    assert finished - notes[0][0] > 1.0, "the first line was notified while the command still ran, not at its end"
    assert [progress for _, progress, _ in notes] == sorted({progress for _, progress, _ in notes})
    assert "line1" in "".join(message or "" for _, _, message in notes)

    notes.clear()
    flood = "for i in $(seq 1 10); do head -c 100000 /dev/zero | tr '\\0' b; sleep 0.1; done"
    result = await tools_client.call_tool("terminal_exec", {"command": flood}, progress_callback=on_progress)
    assert not result.is_error and len(notes) >= 2
    assert all(len((message or "").encode()) < 2048 for _, _, message in notes)


async def test_a_cancelled_terminal_exec_leaves_no_process(tools_client: Client) -> None:
    marker = uuid.uuid4().hex
    arguments = {"command": f"sleep 300; echo {marker}", "timeout": 120}
    async with anyio.create_task_group() as group:
        group.start_soon(tools_client.call_tool, "terminal_exec", arguments)
        pids = await apoll(lambda: live_pids_with(marker), 10, "the command to start")
        pgid = os.getpgid(pids[0])
        group.cancel_scope.cancel()
    try:
        await apoll(lambda: not live_group_members(pgid), PROCESS_DEADLINE, "the cancelled command's group to end")
    finally:
        end_group(pgid)
    still = await tools_client.call_tool("terminal_exec", {"command": "echo still-here"})
    assert text_of(still) == "stdout:\nstill-here\n\nexit_code: 0", "the session outlives a cancelled call"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_client_that_disconnects_mid_call_leaves_no_process(
    live_server: LiveServer, tool_token: str, mode: str
) -> None:
    marker = uuid.uuid4().hex
    arguments = {"command": f"sleep 300; echo {marker}", "timeout": 120}

    async def connect_and_call() -> None:
        async with mcp_client(live_server.mcp_url, tool_token, mode=mode) as client:
            await client.call_tool("terminal_exec", arguments)

    async with anyio.create_task_group() as group:
        group.start_soon(connect_and_call)
        pids = await apoll(lambda: live_pids_with(marker), 10, "the command to start")
        pgid = os.getpgid(pids[0])
        group.cancel_scope.cancel()  # the client goes away: its context is torn down mid-call
    try:
        await apoll(lambda: not live_group_members(pgid), PROCESS_DEADLINE, "the abandoned command's group to end")
    finally:
        end_group(pgid)


# --- terminal_exec_background and terminal_kill ----------------------------------------------------------------------

BACKGROUND_RESULT = re.compile(r"PID: (\d+)\nStarted background process \1\nOutput: (\S+)")


async def test_background_output_lands_in_its_log_and_terminal_kill_stops_the_whole_group(
    tools_client: Client, live_server: LiveServer, workspace_dir: Path
) -> None:
    marker = uuid.uuid4().hex
    command = f"echo {marker}-out; echo {marker}-err >&2; sleep 300 & sleep 300"
    result = await tools_client.call_tool("terminal_exec_background", {"command": command, "cwd": str(workspace_dir)})
    started = BACKGROUND_RESULT.fullmatch(text_of(result))
    assert not result.is_error and started is not None, text_of(result)
    pid, log = int(started[1]), Path(started[2])
    try:
        assert log.parent == live_server.state_dir / "output"

        async def log_text() -> str:
            return text_of(await tools_client.call_tool("terminal_output", {"id": pid, "offset": 0}))

        end = time.monotonic() + 10
        while f"{marker}-err" not in (text := await log_text()) or f"{marker}-out" not in text:
            assert time.monotonic() < end, f"the background output never reached {log}: {text!r}"
            await anyio.sleep(0.05)
        await apoll(lambda: len(live_group_members(pid)) >= 3, 10, "both sleeps to start")

        killed = await tools_client.call_tool("terminal_kill", {"pid": pid})
        assert (text_of(killed), killed.is_error) == (f"Sent SIGTERM to {pid}", False)
        await apoll(lambda: not live_group_members(pid), PROCESS_DEADLINE, "the whole background group to end")
    finally:
        end_group(pid)


async def test_terminal_exec_background_in_a_missing_directory_is_an_error(
    tools_client: Client, workspace_dir: Path
) -> None:
    result = await tools_client.call_tool(
        "terminal_exec_background", {"command": "true", "cwd": str(workspace_dir / "no")}
    )
    assert result.is_error and text_of(result).startswith("Error: ")
    assert "Not a directory" in text_of(result) or "No such file or directory" in text_of(result)


async def test_terminal_kill_refuses_a_live_process_the_server_did_not_start(tools_client: Client) -> None:
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        result = await tools_client.call_tool("terminal_kill", {"pid": stranger.pid})
        assert (text_of(result), result.is_error) == (f"Process {stranger.pid} was not started by this server", True)
        assert stranger.poll() is None, "the process was signalled anyway"
    finally:
        stranger.kill()
        stranger.wait()


async def test_terminal_kill_of_a_pid_that_does_not_exist_is_an_error(tools_client: Client) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not psutil.pid_exists(gone.pid)
    for pid in (gone.pid, 0, -1):
        result = await tools_client.call_tool("terminal_kill", {"pid": pid})
        assert (text_of(result), result.is_error) == (f"No such process {pid}", True)
