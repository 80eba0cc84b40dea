"""The executor's process tools: run_process, run_command, background processes and their signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from mcpserver.executor import capture, jobs, processes, rlimits, spawn
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.interface import BackgroundStart, OutputEvent, ToolFailure
from mcpserver.executor.jobs import JobOps
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import ProcessOps, read_start_ticks
from mcpserver.executor.savedoutput import SavedOutput

pytestmark = pytest.mark.anyio

BUDGET = 64 * 1024
DEADLINE = 10.0


class _Executor(ProcessOps, JobOps):
    def __init__(self, root: Path) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment()
        self.saved_output = SavedOutput(self.workspace)
        self._input_locks = {}


@pytest.fixture
def executor(tmp_path: Path) -> _Executor:
    return _Executor(tmp_path)


async def wait_until(predicate: Callable[[], bool], deadline: float = DEADLINE) -> bool:
    """Poll `predicate` until it holds or `deadline` seconds pass; returns its last value."""
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            return predicate()
        await asyncio.sleep(0.02)
    return True


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def is_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def run(executor: _Executor, command: str, timeout: float = 30, budget: int = BUDGET) -> processes.ExecResult:
    return await executor.run_command(command, None, timeout, budget, None)


# --- run_command ---------------------------------------------------------------------------------------------------


async def test_command_reports_stdout_stderr_and_exit_code(executor: _Executor) -> None:
    result = await run(executor, "echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    assert not result.timed_out and not result.truncated and result.output_path is None
    assert (result.stdout_bytes, result.stderr_bytes) == (4, 4)


async def test_non_zero_exit_code_is_reported(executor: _Executor) -> None:
    result = await run(executor, "echo failing >&2; exit 7")
    assert result.exit_code == 7
    assert result.stderr == "failing\n"


async def test_command_runs_in_the_given_directory(executor: _Executor, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    result = await executor.run_command("pwd", "sub", 10, BUDGET, None)
    assert result.stdout == f"{tmp_path.resolve() / 'sub'}\n"


async def test_cwd_that_is_not_a_directory_is_refused(executor: _Executor, tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ToolFailure, match="Not a directory"):
        await executor.run_command("pwd", "file.txt", 10, BUDGET, None)


async def test_cwd_outside_the_workspace_is_refused(executor: _Executor) -> None:
    with pytest.raises(ToolFailure, match="is outside the allowed directory"):
        await executor.run_command("pwd", "/etc", 10, BUDGET, None)


async def test_timeout_kills_the_whole_group_and_reports_124(executor: _Executor, tmp_path: Path) -> None:
    started = time.monotonic()
    result = await run(executor, "bash -c 'sleep 300 & echo $! > grandchild.pid; sleep 300'", timeout=0.5)
    assert time.monotonic() - started < 60  # not the grandchild's 300 s, however busy the machine
    assert (result.exit_code, result.timed_out) == (124, True)
    assert result.stderr.splitlines()[-1] == "timeout after 0.5s"
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert await wait_until(lambda: not is_alive(grandchild))


async def test_timeout_sigkills_a_command_that_ignores_sigterm(executor: _Executor, tmp_path: Path) -> None:
    result = await run(executor, "trap '' TERM; echo $$ > leader.pid; sleep 300; sleep 300", timeout=0.5)
    assert result.exit_code == 124
    leader = int((tmp_path / "leader.pid").read_text())
    # The SIGKILL reaches the whole group; a member dies a moment after the leader is reaped (a `sleep 300` left
    # alone would outlive the deadline by minutes).
    assert await wait_until(lambda: not group_members(leader))


async def test_huge_output_keeps_memory_bounded_and_spills_every_byte(executor: _Executor) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    peak = before
    running = True

    async def sample() -> None:
        nonlocal peak
        while running:
            peak = max(peak, me.memory_info().rss)
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        result = await run(executor, "head -c 200000000 /dev/zero | tr '\\0' a", timeout=120)
    finally:
        running = False
        await sampler
    assert peak - before < 50 * 1024 * 1024
    assert result.exit_code == 0 and result.truncated
    assert result.stdout_bytes == 200_000_000
    assert len(result.stdout.encode()) <= BUDGET // 2 + 300
    assert result.output_path is not None and result.output_path.endswith(".stdout.log")
    assert os.path.getsize(result.output_path) == 200_000_000


async def test_cut_output_keeps_head_and_tail_around_an_omitted_marker(executor: _Executor) -> None:
    result = await run(executor, "seq 1 100000", budget=4000)
    assert result.stdout.startswith("1\n2\n3\n")
    assert result.stdout.endswith("99999\n100000\n")
    omitted = result.stdout_bytes - 2000
    assert f"\n[... {omitted} bytes omitted; the whole stdout is in {result.output_path}]\n" in result.stdout
    expected = subprocess.run(["seq", "1", "100000"], capture_output=True, check=True).stdout
    assert Path(str(result.output_path)).read_bytes() == expected


async def test_output_path_names_the_stderr_file_when_only_stderr_was_cut(executor: _Executor) -> None:
    result = await run(executor, "echo small; seq 1 10000 >&2", budget=1000)
    assert result.stdout == "small\n"
    assert result.truncated and str(result.output_path).endswith(".stderr.log")
    assert "the whole stderr is in" in result.stderr


async def test_invalid_utf8_is_replaced(executor: _Executor) -> None:
    result = await run(executor, "printf 'ok\\377\\376done'")
    assert result.stdout == "ok\ufffd\ufffddone"


async def test_multibyte_characters_cut_by_head_or_tail_are_dropped_not_mangled(executor: _Executor) -> None:
    # 251 bytes of head and of tail: both cuts fall inside a two-byte "é"
    result = await run(executor, "for i in $(seq 1 5000); do printf 'é'; done", budget=1004)
    assert result.truncated
    assert "\ufffd" not in result.stdout
    head, _, tail = result.stdout.partition("\n[...")
    assert head == "é" * 125 and tail.endswith("é" * 125)


async def test_spill_file_is_cut_at_its_cap(executor: _Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "SPILL_CAP", 10_000)
    result = await run(executor, "seq 1 100000", budget=1000)
    data = Path(str(result.output_path)).read_bytes()
    assert data.startswith(b"1\n2\n3\n")
    assert data.endswith(b"\n[output file cut at 10000 bytes; the command printed more]\n")
    assert len(data) < 10_100


async def test_listener_gets_the_whole_output_in_order_at_most_four_sends_a_second(executor: _Executor) -> None:
    sends: list[tuple[float, list[OutputEvent]]] = []

    async def listener(events: list[OutputEvent]) -> None:
        sends.append((time.monotonic(), events))

    command = "for i in $(seq 1 60); do seq 1 300; sleep 0.02; done"
    started = time.monotonic()
    result = await executor.run_command(command, None, 30, BUDGET, listener)
    elapsed = time.monotonic() - started
    assert result.exit_code == 0
    assert 2 <= len(sends) <= elapsed * 4 + 2
    events = [event for _, batch in sends for event in batch]
    assert "".join(text for _, _, text in events) == "".join(
        "\n".join(map(str, range(1, 301))) + "\n" for _ in range(60)
    )
    assert [at for at, _, _ in events] == sorted(at for at, _, _ in events)
    gaps = [later - earlier for (earlier, _), (later, _) in zip(sends[:-1], sends[1:-1], strict=False)]
    assert all(gap >= 0.2 for gap in gaps)  # the last send, once the command has ended, comes at once


async def test_listener_sees_each_line_of_slow_output_with_its_time_and_stream(executor: _Executor) -> None:
    events: list[OutputEvent] = []

    async def listener(batch: list[OutputEvent]) -> None:
        events.extend(batch)

    command = "for i in 1 2 3; do echo $i; sleep 0.4; done; echo last >&2"
    await executor.run_command(command, None, 30, BUDGET, listener)
    assert [(code, text) for _, code, text in events] == [("o", "1\n"), ("o", "2\n"), ("o", "3\n"), ("e", "last\n")]
    assert events[1][0] - events[0][0] >= 0.35 and events[2][0] - events[1][0] >= 0.35


async def test_listener_gets_the_head_and_tail_of_output_past_its_cap_and_how_much_was_left_out(
    executor: _Executor,
) -> None:
    events: list[OutputEvent] = []

    async def listener(batch: list[OutputEvent]) -> None:
        events.extend(batch)

    command = "for i in $(seq 1 100); do printf '%050d\\n' $i; sleep 0.003; done"
    result = await executor.run_command(command, None, 30, BUDGET, listener, listen_max_bytes=1000)
    assert result.stdout.count("\n") == 100  # the result is not the listener's business
    texts = [text for _, code, text in events if code == "o"]
    [note] = [text for _, code, text in events if code == "m"]
    passed = "".join(texts)
    assert passed.startswith(f"{1:050d}\n") and passed.endswith(f"{100:050d}\n")
    assert len(passed.encode()) <= 1000 + 51
    left_out = int(note.split()[0].lstrip("["))
    assert left_out + len(passed.encode()) == 100 * 51 and "bytes of output left out here" in note


async def test_failing_listener_does_not_stop_the_command(executor: _Executor) -> None:
    async def listener(events: list[OutputEvent]) -> None:
        raise RuntimeError("client went away")

    result = await executor.run_command("echo a; sleep 0.3; echo b", None, 30, BUDGET, listener)
    assert (result.stdout, result.exit_code) == ("a\nb\n", 0)


async def _start_and_cancel(executor: _Executor, tmp_path: Path, command: str) -> int:
    """Run `command` (which writes its pid to leader.pid), cancel the call, and return the process group."""
    task = asyncio.create_task(run(executor, command, timeout=300))
    leader = tmp_path / "leader.pid"
    assert await wait_until(lambda: leader.exists() and leader.read_text().strip() != "")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return int(leader.read_text())


async def test_cancelled_call_leaves_no_process_behind(executor: _Executor, tmp_path: Path) -> None:
    pgid = await _start_and_cancel(executor, tmp_path, "echo $$ > leader.pid; bash -c 'sleep 300 & sleep 300'")
    assert await wait_until(lambda: not group_members(pgid))


async def test_cancelled_call_sigkills_a_group_that_ignores_sigterm(executor: _Executor, tmp_path: Path) -> None:
    pgid = await _start_and_cancel(executor, tmp_path, "trap '' TERM; echo $$ > leader.pid; sleep 300; sleep 1")
    assert group_members(pgid)  # SIGTERM alone did not end it
    assert await wait_until(lambda: not group_members(pgid))


async def test_a_cancelled_calls_command_is_still_reaped_when_it_ends(executor: _Executor, tmp_path: Path) -> None:
    earlier = set(spawn._unreaped)  # job hosts of other tests, which end after their event loop did
    leader = await _start_and_cancel(executor, tmp_path, "echo $$ > leader.pid; sleep 300")
    assert await wait_until(lambda: not spawn._unreaped - earlier)
    with pytest.raises(ChildProcessError):
        os.waitpid(leader, os.WNOHANG)  # reaped already: no zombie left for this process


async def test_without_pidfds_a_thread_waits_for_each_command(
    executor: _Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(pid: int) -> int:
        raise PermissionError("pidfd_open is not allowed here")

    monkeypatch.setattr(os, "pidfd_open", refused)
    earlier = set(spawn._unreaped)  # job hosts of other tests, which end after their event loop did
    result = await run(executor, "echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    timed_out = await run(executor, "sleep 30", timeout=0.3)
    assert (timed_out.timed_out, timed_out.exit_code) == (True, 124)
    assert not spawn._unreaped - earlier


async def test_backgrounded_child_holding_the_pipes_does_not_hang_the_call(executor: _Executor) -> None:
    started = time.monotonic()
    result = await run(executor, "sleep 100 & echo $! > bg.pid; echo started")
    assert time.monotonic() - started < 50  # not the background child's 100 s, however busy the machine
    assert (result.stdout, result.exit_code) == ("started\n", 0)
    assert await wait_until(lambda: not is_alive(int(Path(executor.root, "bg.pid").read_text())))


async def test_command_sees_a_clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDSTORM_SECRET_KEY", "do-not-leak")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "do-not-leak")
    result = await run(_Executor(tmp_path), "env")
    assert "do-not-leak" not in result.stdout
    assert "SANDSTORM_" not in result.stdout
    assert "PATH=" in result.stdout


async def test_spilling_prunes_stale_files_from_the_output_dir(executor: _Executor) -> None:
    stale = executor.saved_output.create() / "exec-old.stdout.log"
    stale.write_text("old")
    eight_days_ago = time.time() - 8 * 24 * 3600
    os.utime(stale, (eight_days_ago, eight_days_ago))
    await run(executor, "seq 1 10000", budget=1000)
    assert not stale.exists()


def test_pruning_removes_old_files_then_the_oldest_until_within_the_budget(tmp_path: Path) -> None:
    saved = SavedOutput(Workspace(tmp_path), max_bytes=250)
    saved.create()
    now = time.time()
    ages = {"ancient": 8 * 24 * 3600, "old": 300, "middle": 200, "new": 100}
    for name, age in ages.items():
        (saved.directory / name).write_bytes(b"x" * 100)
        os.utime(saved.directory / name, (now - age, now - age))
    assert saved.prune() == (2, 4, 200)
    assert sorted(path.name for path in saved.directory.iterdir()) == ["middle", "new"]


# --- background processes ------------------------------------------------------------------------------------------


async def stop_background(started: BackgroundStart) -> None:
    """SIGKILL a background group and wait until the server has reaped its leader."""
    processes.kill_group(started.pgid, signal.SIGKILL)
    assert await wait_until(lambda: read_start_ticks(started.pid) is None)


async def test_background_process_logs_its_output_and_is_its_own_group(executor: _Executor) -> None:
    started = await executor.start_background("echo hello; echo oops >&2; sleep 300", None)
    try:
        log = Path(started.log_path)
        assert log.parent == executor.saved_output.directory
        assert await wait_until(lambda: log.read_text() == "hello\noops\n")
        assert started.pgid == started.pid == os.getpgid(started.pid)
        assert started.start_ticks == read_start_ticks(started.pid) == await executor.process_start_ticks(started.pid)
        assert os.getsid(started.pid) == started.pid
    finally:
        await stop_background(started)


async def test_signal_group_ends_the_whole_background_group(executor: _Executor) -> None:
    started = await executor.start_background("sleep 300 & sleep 300", None)
    assert await wait_until(lambda: len(group_members(started.pgid)) >= 3)
    assert await executor.signal_group(started.pid, started.pgid, started.start_ticks, signal.SIGTERM)
    assert await wait_until(lambda: not group_members(started.pgid))
    assert await wait_until(lambda: read_start_ticks(started.pid) is None)  # reaped, not left a zombie


async def test_signal_group_refuses_when_start_ticks_differ(executor: _Executor) -> None:
    started = await executor.start_background("sleep 300", None)
    try:
        wrong = started.start_ticks - 1
        assert not await executor.signal_group(started.pid, started.pgid, wrong, signal.SIGTERM)
        assert not await executor.signal_group(started.pid, started.pgid + 1, started.start_ticks, signal.SIGTERM)
        assert is_alive(started.pid)
    finally:
        await stop_background(started)


async def test_finished_background_process_is_reaped_and_its_log_uncut(executor: _Executor) -> None:
    started = await executor.start_background("echo short", None)
    assert await wait_until(lambda: read_start_ticks(started.pid) is None)  # gone, not a zombie
    assert Path(started.log_path).read_text() == "short\n"
    assert not await executor.signal_group(started.pid, started.pgid, started.start_ticks, signal.SIGTERM)


async def test_background_log_is_capped_without_killing_the_command(
    executor: _Executor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(jobs, "BACKGROUND_LOG_CAP", 1000)
    started = await executor.start_background("head -c 50000 /dev/zero | tr '\\0' b; echo finished > done", None)
    assert await wait_until(lambda: read_start_ticks(started.pid) is None)
    assert (tmp_path / "done").read_text() == "finished\n"
    assert Path(started.log_path).read_text() == "b" * 1000 + "\n[log cut at 1000 bytes]\n"


async def test_start_ticks_of_a_dead_process_are_none(executor: _Executor) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert await executor.process_start_ticks(child.pid) is None


async def test_start_ticks_parse_a_process_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    script = tmp_path / "a) b ("
    script.write_text("#!/bin/sh\nsleep 300\n")
    script.chmod(0o755)
    child = subprocess.Popen([str(script)])
    try:
        expected = psutil.Process(child.pid).create_time()
        ticks = read_start_ticks(child.pid)
        assert ticks is not None
        boot = psutil.boot_time()
        assert abs(boot + ticks / os.sysconf("SC_CLK_TCK") - expected) < 1
    finally:
        child.kill()
        child.wait()


async def test_a_background_process_is_started_like_a_command_and_reaped_when_it_ends(
    executor: _Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned: list[int] = []
    monkeypatch.setattr(rlimits.keeper, "pin", pinned.append)
    started = await executor.start_background("sleep 300", None)
    host = psutil.Process(started.pid).ppid()
    assert pinned == [host]  # the limits are pinned in its job host, its parent
    await stop_background(started)
    assert await wait_until(lambda: all(child.pid != host for child in spawn._unreaped))  # the host ended, reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(started.pid, os.WNOHANG)  # reaped already: no zombie left for it


async def test_a_background_start_that_meets_the_task_limit_reads_the_hosts_count_again_and_retries(
    executor: _Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = spawn._popen
    refreshed: list[bool] = []
    monkeypatch.setattr(rlimits.keeper, "refresh_now", lambda: refreshed.append(True))
    attempts: list[list[str]] = []

    def once_eagain(argv: list[str], *args: Any) -> subprocess.Popen[bytes]:
        attempts.append(argv)
        if len(attempts) == 1:
            raise BlockingIOError("Resource temporarily unavailable")
        return real(argv, *args)

    monkeypatch.setattr(spawn, "_popen", once_eagain)
    started = await executor.start_background("sleep 300", None)
    try:
        assert len(attempts) == 2 and refreshed == [True]
        assert is_alive(started.pid)
    finally:
        os.killpg(started.pgid, signal.SIGKILL)
