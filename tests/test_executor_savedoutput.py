"""The saved-output budget: output past it is saved in part or not at all, results say so, and nothing is deleted."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpserver.executor import savedoutput
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.jobs import JobOps
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import ProcessOps
from mcpserver.executor.savedoutput import SavedOutput

pytestmark = pytest.mark.anyio

BUDGET = 50_000
LINES = "seq 1 100000"  # 588,895 bytes


class _Executor(ProcessOps, JobOps):
    def __init__(self, root: Path, max_bytes: int = BUDGET) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment()
        self.saved_output = SavedOutput(self.workspace, max_bytes)
        self._input_locks = {}


def used(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.iterdir())


async def test_output_past_the_budget_is_saved_in_part_and_the_result_says_where_and_why(tmp_path: Path) -> None:
    executor = _Executor(tmp_path)
    result = await executor.run_command(LINES, None, 30, 1000, None)
    assert result.stdout.startswith("1\n2\n3\n") and result.stdout.endswith("99999\n100000\n")  # head and tail kept
    assert f"holds only its first {BUDGET} bytes" in result.stdout and "SANDSTORM_OUTPUT_MAX_BYTES" in result.stdout
    saved = Path(str(result.output_path)).read_bytes()
    assert saved.startswith(b"1\n2\n3\n") and saved.endswith(
        b"[output file cut at 50000 bytes: the saved-output budget is full]\n"
    )
    assert used(executor.saved_output.directory) < BUDGET + 100


async def test_once_the_budget_is_full_new_output_is_not_saved_and_old_output_stays(tmp_path: Path) -> None:
    executor = _Executor(tmp_path)
    first = await executor.run_command(LINES, None, 30, 1000, None)
    second = await executor.run_command("seq 5 100005", None, 30, 1000, None)
    assert second.output_path is None and second.truncated
    assert "the whole stdout was not saved: saved output in" in second.stdout
    assert "reached its budget of 50000 bytes (SANDSTORM_OUTPUT_MAX_BYTES)" in second.stdout
    assert "prune_output" in second.stdout and second.stdout.endswith("100004\n100005\n")
    assert [path.name for path in executor.saved_output.directory.iterdir()] == [Path(str(first.output_path)).name]


async def test_a_flood_of_large_outputs_never_takes_more_than_the_budget(tmp_path: Path) -> None:
    executor = _Executor(tmp_path, max_bytes=300_000)
    for _ in range(20):
        await executor.run_command("seq 1 20000", None, 30, 1000, None)  # 108,894 bytes each
    assert used(executor.saved_output.directory) < 300_000 + 100


async def test_the_directory_is_measured_once_not_on_every_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[Path] = []
    real = savedoutput._entries

    def counting(directory: Path) -> Iterator[savedoutput._Entry]:
        walks.append(directory)
        return real(directory)

    monkeypatch.setattr(savedoutput, "_entries", counting)
    executor = _Executor(tmp_path, max_bytes=10_000_000)
    for _ in range(5):
        result = await executor.run_command("seq 1 20000", None, 30, 1000, None)
        assert result.output_path is not None
    assert len(walks) == 1


async def test_room_freed_by_deleting_files_is_found_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(savedoutput, "RESCAN_INTERVAL", 0.0)
    executor = _Executor(tmp_path)
    first = await executor.run_command(LINES, None, 30, 1000, None)
    Path(str(first.output_path)).unlink()  # as file_delete or rm would
    again = await executor.run_command(LINES, None, 30, 1000, None)
    assert again.output_path is not None and f"holds only its first {BUDGET} bytes" in again.stdout


async def test_files_past_their_age_make_room_on_their_own(tmp_path: Path) -> None:
    executor = _Executor(tmp_path)
    stale = executor.saved_output.create() / "exec-old.stdout.log"
    stale.write_bytes(b"x" * BUDGET)
    eight_days_ago = time.time() - 8 * 24 * 3600
    os.utime(stale, (eight_days_ago, eight_days_ago))
    result = await executor.run_command("seq 1 10000", None, 30, 1000, None)
    assert not stale.exists() and result.output_path is not None and "budget" not in result.stdout


async def test_a_background_command_gets_the_room_left_for_its_log_or_a_clear_refusal(tmp_path: Path) -> None:
    executor = _Executor(tmp_path)
    await executor.run_command(LINES, None, 30, 1000, None)  # fills the budget
    with pytest.raises(ToolFailure, match=r"not started: there is no room for its log: saved output in .* budget"):
        await executor.start_background("echo never", None)
    assert len(list(executor.saved_output.directory.iterdir())) == 1


async def test_no_budget_saves_everything(tmp_path: Path) -> None:
    executor = _Executor(tmp_path, max_bytes=0)
    result = await executor.run_command(LINES, None, 30, 1000, None)
    assert Path(str(result.output_path)).stat().st_size == 588_895


def test_pruning_deletes_the_oldest_until_within_the_budget_or_the_bytes_asked(tmp_path: Path) -> None:
    saved = SavedOutput(Workspace(tmp_path), max_bytes=250)
    now = time.time()
    for name, age in {"old": 300, "middle": 200, "new": 100}.items():
        (saved.create() / name).write_bytes(b"x" * 100)
        os.utime(saved.directory / name, (now - age, now - age))
    assert saved.prune() == (1, 3, 200)
    assert sorted(path.name for path in saved.directory.iterdir()) == ["middle", "new"]
    assert saved.prune(max_bytes=0) == (2, 2, 0)
    assert saved.grant(250) == 250  # the running total follows the prune
