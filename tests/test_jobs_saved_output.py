"""Where background logs and saved output live (issue 31): the executor's own directory outside the workspace, which
no tool reaches; the job host gets descriptors, never a path to open; jobs from before the move are still read."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.local import LocalExecutor
from mcpserver.executor.savedoutput import OutputDirInWorkspace

pytestmark = pytest.mark.anyio
BUDGET = 64 * 1024
DEADLINE_MS = 10_000


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root


@pytest.fixture
def executor(workspace: Path, tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(str(workspace), output_dir=str(tmp_path / "state" / "output"))


async def test_a_jobs_log_state_and_input_are_outside_the_workspace_where_no_tool_reaches(
    executor: LocalExecutor, workspace: Path, tmp_path: Path
) -> None:
    job = await executor.start_background("echo private", None, "stdin")
    log = Path(job.log_path)
    assert log.parent == tmp_path / "state" / "output"
    assert {log.with_suffix(".state").exists(), log.with_suffix(".in").exists()} == {True}
    assert not (workspace / ".sandstorm").exists()
    assert (log.parent.stat().st_mode & 0o777) == 0o700
    for read in (
        executor.read_file(job.log_path, None, None, BUDGET),
        executor.glob_files("**/*.log", str(log.parent), BUDGET),
    ):
        with pytest.raises(ToolFailure, match="is outside the allowed directory"):
            await read
    found = await executor.job_output(job.log_path, job.pid, job.start_ticks, 0, None, BUDGET, DEADLINE_MS, True)
    assert found["output"] == "private\n"


async def test_the_job_host_is_handed_descriptors_never_a_path_to_open(executor: LocalExecutor) -> None:
    """A confined host may not write by path outside the workspace: the executor opens the files for it."""
    job = await executor.start_background("sleep 5", None, "pty")
    try:
        host = int(Path(f"/proc/{job.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        spec = json.loads(Path(f"/proc/{host}/cmdline").read_bytes().split(b"\0")[-2])
        assert str(executor.saved_output.directory) not in json.dumps(spec)
        assert {spec["log_fd"], spec["state_fd"], spec["fifo_fd"]} <= {int(fd) for fd in os.listdir(f"/proc/{host}/fd")}
        # Until it execs, the forked command is a copy of the host and holds the host's descriptors.
        for _ in range(200):
            if b"jobhost" not in Path(f"/proc/{job.pid}/cmdline").read_bytes():
                break
            await asyncio.sleep(0.025)
        else:
            raise AssertionError("the command was not exec'd within 5 s")
        command_fds = {os.readlink(f"/proc/{job.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{job.pid}/fd")}
        assert not any(str(executor.saved_output.directory) in target for target in command_fds)
    finally:
        await executor.end_job(job.log_path, job.pid, job.start_ticks)


async def test_a_job_started_before_the_move_is_still_read_in_the_old_place(
    executor: LocalExecutor, workspace: Path
) -> None:
    old = workspace / ".sandstorm" / "output"
    old.mkdir(parents=True)
    log = old / "bg-20250101-120000-1a2b3c4d.log"
    log.write_text("from before\n")
    log.with_suffix(".state").write_text(json.dumps({"state": "exited", "exit_code": 0, "mode": "none"}))
    found = await executor.job_output(str(log), 1, 1, 0, None, BUDGET, 0)
    assert (found["state"], found["output"]) == ("exited", "from before\n")


@pytest.mark.parametrize("inside", ["", "sub/output", ".sandstorm/output"])
def test_a_saved_output_directory_inside_the_workspace_is_refused(workspace: Path, inside: str) -> None:
    with pytest.raises(OutputDirInWorkspace, match="must be outside the workspace"):
        LocalExecutor(str(workspace), output_dir=str(workspace / inside))


def test_the_executor_refuses_to_start_with_its_output_in_the_workspace(workspace: Path) -> None:
    from mcpserver.executor.__main__ import main

    with pytest.raises(SystemExit, match="--output-dir: the saved-output directory .* must be outside the workspace"):
        main(["--workspace", str(workspace), "--allow-uid", str(os.getuid()), "--socket", str(workspace / "s"),
              "--output-dir", str(workspace / "out"), "--log-format", "text"])  # fmt: skip


async def test_a_cut_commands_saved_output_is_paged_by_its_unguessable_name(executor: LocalExecutor) -> None:
    result = await executor.run_command("seq 1 100000", None, 30, 1000, None)
    spill = Path(str(result.output_path))
    assert spill.parent == executor.saved_output.directory and len(spill.name.split("-")[-1]) == len("0" * 32) + 11
    page = await executor.read_saved_output(spill.name, None, 13, BUDGET)
    assert (page["output"], page["size"], page["next_offset"]) == ("99999\n100000\n", 588_895, 588_895)
    head = await executor.read_saved_output(spill.name, 0, None, 6)  # JSON bytes: each newline counts two
    assert (head["output"], head["next_offset"]) == ("1\n2\n", 4)


@pytest.mark.parametrize(
    "name",
    ["../secret.log", "bg-20250101-120000-1a2b3c4d.log", "exec-20250101-120000-1a2b3c4d.stdout.log", "/etc/passwd"],
)
async def test_only_saved_output_by_its_full_name_is_read(executor: LocalExecutor, name: str) -> None:
    with pytest.raises(ToolFailure, match="is not the name of a command's saved output"):
        await executor.read_saved_output(name, 0, None, BUDGET)
