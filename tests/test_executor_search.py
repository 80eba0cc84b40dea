"""The executor's searches (mcpserver/executor/search.py) over a real tree with rg: what they skip, what they never
follow, and how they page."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.local import LocalExecutor

pytestmark = pytest.mark.anyio
BUDGET = 256 * 1024


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = Path(os.path.realpath(tmp_path)) / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n")
    (root / "src" / "pkg" / "util.js").write_text("const RETURN_A = 1;\n")
    (root / ".gitignore").write_text("build/\nsecret.log\n")
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("return a - b\n")
    (root / "secret.log").write_text("return a - b\n")
    (root / ".github").mkdir()
    (root / ".github" / "ci.yml").write_text("run: return a - b\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("return a - b\n")
    (root / ".sandstorm").mkdir()
    (root / ".sandstorm" / "saved.log").write_text("return a - b\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "leak.py").write_text("return a - b\n")
    (root / "src" / "out-link").symlink_to(outside)
    (root / "src" / "leak-link.py").symlink_to(outside / "leak.py")
    return root


@pytest.fixture
def executor(tree: Path) -> LocalExecutor:
    return LocalExecutor(str(tree))


async def grep(executor: LocalExecutor, pattern: str, **options: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "path": None, "glob": None, "type": None, "output_mode": "files_with_matches", "case_insensitive": False,
        "line_numbers": True, "context_before": None, "context_after": None, "multiline": False,
        "head_limit": None, "offset": 0, "max_bytes": BUDGET,
    }  # fmt: skip
    args.update(options)
    return await executor.grep(pattern, **args)


async def test_gitignored_git_and_sandstorm_are_skipped_and_links_are_not_followed(executor: LocalExecutor) -> None:
    found = await grep(executor, r"return a\s*-\s*b")
    assert sorted(found["entries"]) == [".github/ci.yml", "src/calc.py"]


async def test_content_lines_are_relative_to_the_searched_path_with_numbers(executor: LocalExecutor) -> None:
    found = await grep(executor, "return a - b", path="src", output_mode="content")
    assert found["entries"] == ["calc.py:2:    return a - b", "calc.py:6:    return a - b"]
    plain = await grep(executor, "return a - b", path="src", output_mode="content", line_numbers=False)
    assert plain["entries"][0] == "calc.py:    return a - b"


async def test_context_count_case_and_multiline(executor: LocalExecutor) -> None:
    around = await grep(executor, "def sub", path="src", output_mode="content", context_before=1, context_after=1)
    assert around["entries"] == ["calc.py-4-", "calc.py:5:def sub(a, b):", "calc.py-6-    return a - b"]
    counted = await grep(executor, "return", path="src", output_mode="count")
    assert counted["entries"] == ["calc.py:2"] and counted["matches"] == 2
    folded = await grep(executor, "return_a", case_insensitive=True)
    assert folded["entries"] == ["src/pkg/util.js"]
    spanning = await grep(executor, r"b\):\n    return", multiline=True, output_mode="count", path="src")
    assert spanning["matches"] == 2


async def test_type_and_glob_narrow_the_search(executor: LocalExecutor) -> None:
    assert (await grep(executor, "RETURN", type="js"))["entries"] == ["src/pkg/util.js"]
    assert (await grep(executor, "return", glob="*.py"))["entries"] == ["src/calc.py"]
    excluded = await grep(executor, "return", glob="!*.py", case_insensitive=True)
    assert sorted(excluded["entries"]) == [".github/ci.yml", "src/pkg/util.js"]


async def test_paging_with_head_limit_and_offset(executor: LocalExecutor, tree: Path) -> None:
    (tree / "many.txt").write_text("".join(f"hit {n}\n" for n in range(10)))
    first = await grep(executor, "hit", output_mode="content", head_limit=4)
    assert first["entries"] == [f"many.txt:{n + 1}:hit {n}" for n in range(4)]
    assert (first["total"], first["offset"], first["next_offset"]) == (10, 0, 4)
    last = await grep(executor, "hit", output_mode="content", head_limit=4, offset=8)
    assert last["entries"] == ["many.txt:9:hit 8", "many.txt:10:hit 9"] and last["next_offset"] is None
    small = await grep(executor, "hit", output_mode="content", max_bytes=60)
    assert 0 < len(small["entries"]) < 10 and small["next_offset"] == len(small["entries"])


async def test_files_come_newest_first(executor: LocalExecutor, tree: Path) -> None:
    for age, name in enumerate(["new.txt", "mid.txt", "old.txt"]):
        (tree / name).write_text("marker\n")
        stamp = time.time() - 100 * (age + 1)
        os.utime(tree / name, (stamp, stamp))
    assert (await grep(executor, "marker"))["entries"] == ["new.txt", "mid.txt", "old.txt"]
    globbed = await executor.glob_files("*.txt", None, BUDGET)
    assert globbed["entries"] == ["new.txt", "mid.txt", "old.txt"] and globbed["total"] == 3


async def test_glob_lists_matching_files_without_following_links(executor: LocalExecutor) -> None:
    found = await executor.glob_files("**/*.py", None, BUDGET)
    assert found["entries"] == ["src/calc.py"]  # not the links, not build/ (ignored), not .git
    assert (await executor.glob_files("*.yml", None, BUDGET))["entries"] == [".github/ci.yml"]


async def test_escapes_through_path_are_refused(executor: LocalExecutor, tree: Path) -> None:
    for path in ("src/out-link", "../outside", str(tree.parent / "outside"), "src/../../outside"):
        with pytest.raises(ToolFailure, match="is outside the allowed directory"):
            await grep(executor, "return", path=path)
        with pytest.raises(ToolFailure, match="is outside the allowed directory"):
            await executor.glob_files("*", path, BUDGET)


async def test_a_file_as_path_and_a_bad_regex_are_clear_errors(executor: LocalExecutor) -> None:
    with pytest.raises(ToolFailure, match="Not a directory"):
        await grep(executor, "x", path="src/calc.py")
    with pytest.raises(ToolFailure, match="regex parse error"):
        await grep(executor, "(unclosed", output_mode="content")
    with pytest.raises(ToolFailure, match="offset must be 0 or more"):
        await grep(executor, "x", offset=-1)


async def test_no_match_is_not_an_error(executor: LocalExecutor) -> None:
    found = await grep(executor, "no such text anywhere")
    assert found == {"entries": [], "total": 0, "offset": 0, "next_offset": None, "output_cut": False}
