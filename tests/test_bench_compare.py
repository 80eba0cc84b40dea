"""`python -m bench --compare REF`'s pieces that need no server: the checkout, the turns, the sums, the verdict."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.compare import WORSE_LIMIT, _borrow, checkout, differences, verdict
from bench.sections import _added, in_turn
from tests.live import REPO


def ratios(exec_ratio: float | None, read_ratio: float | None) -> dict[str, Any]:
    return {"sequential": {"terminal_exec_true": {"ratio": exec_ratio}, "file_read_1kb": {"ratio": read_ratio}}}


def test_a_ratio_at_most_ten_percent_worse_meets_the_rule_and_one_beyond_does_not() -> None:
    found = {rule["key"]: rule for rule in verdict(ratios(3.0, 1.0), ratios(3.0 * WORSE_LIMIT, 1.11))}
    assert found["terminal_exec_true"]["met"] is True and found["terminal_exec_true"]["change"] == pytest.approx(0.1)
    assert found["file_read_1kb"]["met"] is False and found["file_read_1kb"]["change"] == pytest.approx(0.11)


def test_a_better_ratio_meets_the_rule_and_a_missing_one_is_not_judged() -> None:
    found = {rule["key"]: rule for rule in verdict(ratios(3.5, None), ratios(2.5, 0.8))}
    assert found["terminal_exec_true"]["met"] is True and found["terminal_exec_true"]["change"] < 0
    assert found["file_read_1kb"]["met"] is None and found["file_read_1kb"]["change"] is None


def test_every_label_takes_every_place_in_the_turns() -> None:
    orders = [in_turn(["a", "b", "c"], turn) for turn in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert in_turn(["old", "new"], 3) == ["new", "old"]


def test_loads_on_one_server_add_up() -> None:
    def load(calls: int, seconds: float, latencies: list[float], errors: dict[str, int]) -> dict[str, Any]:
        return {"clients": 2, "calls_per_client": 3, "calls": calls, "seconds": seconds, "latency_s": latencies,
                "errors": errors, "sessions": [f"s{calls}"]}  # fmt: skip

    added = _added([load(6, 2.0, [0.1, 0.3], {"http_500": 1}), load(4, 1.0, [0.2], {"http_500": 2, "tool_error": 1})])
    assert added["rounds"] == 2 and added["calls"] == 10 and added["seconds"] == 3.0
    assert added["calls_per_s"] == round(10 / 3.0, 1) and added["latency"]["n"] == 3
    assert added["latency"]["median_ms"] == 200.0
    assert added["errors"] == {"http_500": 3, "tool_error": 1} and added["sessions"] == ["s6", "s4"]


def worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True).stdout


def test_the_ref_is_checked_out_into_a_worktree_that_is_removed_afterwards() -> None:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    with checkout("HEAD") as (tree, commit):
        assert commit == head.stdout.strip()
        assert (tree / "manage.py").is_file() and str(tree) in worktrees()
    assert not tree.exists() and str(tree) not in worktrees()


def test_a_ref_that_is_not_a_commit_is_refused() -> None:
    with pytest.raises(SystemExit, match="not a commit"), checkout("no-such-ref-anywhere"):
        pass


def test_dependencies_that_differ_are_named() -> None:
    old = {"requirements.lock": "a==1\n", "dependencies": ["a"], "optional-dependencies": {"test": ["b"]}}
    new = {"requirements.lock": "a==2\n", "dependencies": ["a"], "optional-dependencies": {"test": ["b", "c"]}}
    assert differences(old, new) == ["requirements.lock", "optional-dependencies"]


def test_a_cached_database_of_the_old_schema_is_copied_once_and_left_in_place(tmp_path: Path) -> None:
    source, target = tmp_path / "cache" / "seed10-abc", tmp_path / "cache" / "compare" / "seed10-abc"
    (source / "state").mkdir(parents=True)
    (source / "state" / "db.sqlite3").write_text("seeded")
    _borrow(source, target)
    assert (target / "state" / "db.sqlite3").read_text() == "seeded" and (source / "state").is_dir()
    (source / "state" / "db.sqlite3").write_text("changed")
    _borrow(source, target)
    assert (target / "state" / "db.sqlite3").read_text() == "seeded"
    _borrow(tmp_path / "cache" / "seed10-none", tmp_path / "cache" / "compare" / "seed10-none")
    assert not (tmp_path / "cache" / "compare" / "seed10-none").exists()
