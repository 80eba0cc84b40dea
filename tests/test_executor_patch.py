"""The executor's patch operation (mcpserver/executor/patching.py): several files changed all together or not at all,
confined to the workspace as file_edit is, against hostile paths, links and files that change while it runs."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from mcpserver.executor import patching
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.patching import PatchOps
from mcpserver.executor.paths import Workspace
from tests import beneath_fixtures
from tests import test_executor_files_race as race

pytestmark = pytest.mark.anyio

# Every test runs with paths opened by openat2 and again with the O_NOFOLLOW walk, in a fresh workspace.
resolution = beneath_fixtures.resolution
ws = beneath_fixtures.ws
arena, racer = race.arena, race.racer  # a directory and a symlink out of the workspace, swapped in a loop
BUDGET = 256 * 1024
OUTSIDE = "is outside the allowed directory"
UNCHANGED = "so no file was changed"


class Patches(PatchOps):
    def __init__(self, root: Path) -> None:
        self.workspace = Workspace(root)


@pytest.fixture
def patches(ws: Path) -> Patches:
    return Patches(ws)


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


async def failure(call: Awaitable[object]) -> str:
    with pytest.raises(ToolFailure) as caught:
        await call
    return str(caught.value)


def tree(root: Path) -> dict[str, str]:
    """Every file and link under `root` (links as `-> target`), hidden ones included: nothing may be left behind."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[name] = path.read_text()
    return found


def seed(ws: Path) -> None:
    (ws / "a.txt").write_text("alpha\nbeta\n")
    (ws / "b.txt").write_text("bee\n")
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("def greet():\n    print('Hi')\n    return 1\n")


MULTI = patch(
    "*** Add File: docs/new.txt",
    "+one",
    "+two",
    "*** Update File: a.txt",
    "@@",
    " alpha",
    "-beta",
    "+BETA",
    "*** Update File: src/app.py",
    "*** Move to: src/main.py",
    "@@ def greet():",
    "-    print('Hi')",
    "+    print('Hello')",
    "*** Delete File: b.txt",
)


async def test_a_patch_adds_updates_moves_and_deletes_and_answers_with_a_line_per_file_and_the_diff(
    patches: Patches, ws: Path
) -> None:
    seed(ws)
    done = await patches.apply_patch(MULTI, BUDGET)
    assert tree(ws) == {
        "a.txt": "alpha\nBETA\n",
        "docs/new.txt": "one\ntwo\n",
        "src/main.py": "def greet():\n    print('Hello')\n    return 1\n",
    }
    assert done["files"] == [
        {"action": "added", "path": f"{ws}/docs/new.txt", "added_lines": 2, "removed_lines": 0},
        {"action": "updated", "path": f"{ws}/a.txt", "added_lines": 1, "removed_lines": 1},
        {
            "action": "moved",
            "path": f"{ws}/src/main.py",
            "moved_from": f"{ws}/src/app.py",
            "added_lines": 1,
            "removed_lines": 1,
        },
        {"action": "deleted", "path": f"{ws}/b.txt", "added_lines": 0, "removed_lines": 1},
    ]
    summary, diff = done["text"].split("\n\n", 1)
    assert summary.split("\n") == [
        "Applied the patch to 4 files (+4 -3):",
        f"added {ws}/docs/new.txt (+2)",
        f"updated {ws}/a.txt (+1 -1)",
        f"moved {ws}/src/app.py \u2192 {ws}/src/main.py (+1 -1)",
        f"deleted {ws}/b.txt (-1)",
    ]
    assert diff == (
        f"--- /dev/null\n+++ {ws}/docs/new.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n"
        f"--- {ws}/a.txt\n+++ {ws}/a.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+BETA\n"
        f"--- {ws}/src/app.py\n+++ {ws}/src/main.py\n@@ -1,3 +1,3 @@\n def greet():\n-    print('Hi')\n"
        "+    print('Hello')\n     return 1\n"
        f"--- {ws}/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bee\n"
    )
    assert done["diff_truncated"] is False


async def test_modes_are_kept_a_move_takes_its_mode_along_and_a_new_file_is_0644(patches: Patches, ws: Path) -> None:
    (ws / "run.sh").write_text("echo hi\n")
    (ws / "run.sh").chmod(0o751)
    (ws / "tool.sh").write_text("echo a\n")
    (ws / "tool.sh").chmod(0o700)
    text = patch(
        "*** Update File: run.sh",
        "-echo hi",
        "+echo there",
        "*** Update File: tool.sh",
        "*** Move to: bin/tool.sh",
        "*** Add File: new.txt",
        "+x",
    )
    await patches.apply_patch(text, BUDGET)
    modes = {name: stat.S_IMODE((ws / name).stat().st_mode) for name in ("run.sh", "bin/tool.sh", "new.txt")}
    assert modes == {"run.sh": 0o751, "bin/tool.sh": 0o700, "new.txt": 0o644}
    assert not (ws / "tool.sh").exists() and (ws / "bin/tool.sh").read_text() == "echo a\n"


async def test_operations_apply_in_order_each_to_what_the_ones_before_left(patches: Patches, ws: Path) -> None:
    text = patch(
        "*** Add File: n.txt",
        "+first",
        "*** Update File: n.txt",
        "-first",
        "+second",
        "*** Update File: n.txt",
        "*** Move to: m.txt",
        "*** Add File: gone.txt",
        "+x",
        "*** Delete File: gone.txt",
    )
    done = await patches.apply_patch(text, BUDGET)
    assert tree(ws) == {"m.txt": "second\n"}
    assert [entry["action"] for entry in done["files"]] == ["added", "updated", "moved", "added", "deleted"]


async def test_an_add_onto_an_existing_file_replaces_it_as_codex_does_and_says_so(patches: Patches, ws: Path) -> None:
    (ws / "dup.txt").write_text("old\n")
    done = await patches.apply_patch(patch("*** Add File: dup.txt", "+new"), BUDGET)
    assert (ws / "dup.txt").read_text() == "new\n"
    assert f"added {ws}/dup.txt (replacing the file there) (+1 -1)" in done["text"]


@pytest.mark.parametrize(
    "hostile",
    [
        ["*** Add File: ../escaped.txt", "+x"],
        ["*** Update File: {outside}/secret.txt", "-password=1", "+password=2"],
        ["*** Delete File: {outside}/secret.txt"],
        ["*** Add File: out/planted.txt", "+x"],  # `out` is a symlink to a directory outside
        ["*** Delete File: out/secret.txt"],
        ["*** Update File: out/secret.txt", "-password=1", "+password=2"],
        ["*** Update File: link.txt", "-password=1", "+password=2"],  # a symlink to a file outside
        ["*** Update File: a.txt", "*** Move to: ../moved.txt"],
        ["*** Update File: a.txt", "*** Move to: out/moved.txt"],
    ],
)
async def test_a_path_leading_out_of_the_workspace_refuses_the_whole_patch(
    patches: Patches, ws: Path, tmp_path: Path, hostile: list[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("password=1\n")
    (ws / "out").symlink_to(outside)
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "a.txt").write_text("a\n")
    before = tree(ws)
    lines = [line.format(outside=outside) for line in hostile]
    message = await failure(patches.apply_patch(patch("*** Add File: fine.txt", "+x", *lines), BUDGET))
    assert OUTSIDE in message
    assert tree(ws) == before and tree(outside) == {"secret.txt": "password=1\n"}
    assert sorted(os.listdir(tmp_path)) == ["outside", "ws"]


async def test_a_link_is_neither_deleted_nor_replaced_but_an_update_through_one_inside_edits_its_target(
    patches: Patches, ws: Path
) -> None:
    (ws / "real.txt").write_text("x = 1\n")
    (ws / "alias.txt").symlink_to("real.txt")
    (ws / "other.txt").write_text("o\n")
    for refused in (
        ["*** Delete File: alias.txt"],
        ["*** Update File: other.txt", "*** Move to: alias.txt"],
    ):
        message = await failure(patches.apply_patch(patch(*refused), BUDGET))
        assert message == f"Error: {ws}/alias.txt: a symbolic link; apply_patch neither deletes nor replaces links " + (
            f"(file_delete removes one), {UNCHANGED}"
        )
    done = await patches.apply_patch(patch("*** Update File: alias.txt", "-x = 1", "+x = 2"), BUDGET)
    assert done["files"][0]["path"] == f"{ws}/real.txt"
    assert tree(ws) == {"alias.txt": "-> real.txt", "other.txt": "o\n", "real.txt": "x = 2\n"}


async def test_a_patch_whose_third_file_does_not_apply_leaves_the_first_two_untouched(
    patches: Patches, ws: Path
) -> None:
    seed(ws)
    (ws / "c.txt").write_text("gamma\n")
    before = tree(ws)
    text = patch(
        "*** Update File: a.txt",
        "-beta",
        "+BETA",
        "*** Add File: new/d.txt",
        "+d",
        "*** Update File: c.txt",
        "-delta",
        "+DELTA",
    )
    message = await failure(patches.apply_patch(text, BUDGET))
    assert message.startswith(f"Error: {ws}/c.txt: hunk 1 of 1 (patch line 8) did not apply, {UNCHANGED}")
    assert tree(ws) == before and not (ws / "new").exists()


async def test_a_missing_binary_or_special_file_refuses_the_patch(patches: Patches, ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"head\x00tail\n")
    (ws / "latin.txt").write_bytes(b"caf\xe9\n")
    os.mkfifo(ws / "pipe")
    (ws / "dir").mkdir()
    cases = {
        "*** Update File: nope.txt": f"Error: {ws}/nope.txt: No such file or directory (patch line 2), {UNCHANGED}",
        "*** Delete File: nope.txt": f"Error: {ws}/nope.txt: No such file or directory (patch line 2), {UNCHANGED}",
        "*** Update File: blob.bin": f"Error: {ws}/blob.bin: binary file, not patched, {UNCHANGED}",
        "*** Update File: latin.txt": f"Error: {ws}/latin.txt: binary file (not valid UTF-8), not patched, {UNCHANGED}",
        "*** Update File: pipe": f"Error: {ws}/pipe: Not a regular file, {UNCHANGED}",
        "*** Delete File: dir": f"Error: {ws}/dir: Is a directory",
        "*** Update File: ": "Error: invalid patch: line 2: '*** Update File:' names no path",
    }
    for header, expected in cases.items():
        lines = [header] if "Delete" in header else [header, "-x", "+y"]
        assert await failure(patches.apply_patch(patch(*lines), BUDGET)) == expected, header
    done = await patches.apply_patch(patch("*** Delete File: blob.bin"), BUDGET)  # deleting a binary file is fine
    assert done["text"].endswith(f"--- {ws}/blob.bin\n+++ /dev/null\nBinary file, not shown\n")


async def test_a_rename_failing_midway_undoes_the_files_already_written(
    patches: Patches, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(ws)
    before, inode = tree(ws), (ws / "a.txt").stat().st_ino
    rename = os.rename

    def full_at_the_third(src: str, dst: str, **fds: Any) -> None:
        if dst == "c.txt" and src.endswith(".patch"):
            raise OSError(errno.ENOSPC, "No space left on device")
        rename(src, dst, **fds)

    monkeypatch.setattr(patching.os, "rename", full_at_the_third)
    text = patch(
        "*** Update File: a.txt",
        "-beta",
        "+BETA",
        "*** Delete File: b.txt",
        "*** Add File: sub/new/c.txt",
        "+c",
    )
    message = await failure(patches.apply_patch(text, BUDGET))
    assert message == (
        f"Error: {ws}/sub/new/c.txt: No space left on device; the files written before it were restored, {UNCHANGED}"
    )
    assert tree(ws) == before and not (ws / "sub").exists()
    assert (ws / "a.txt").stat().st_ino == inode  # the very file that was there, renamed back


async def test_an_undo_that_fails_names_what_it_left_and_where_the_old_content_is(
    patches: Patches, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(ws)
    rename = os.rename

    def stuck(src: str, dst: str, **fds: Any) -> None:
        if (dst == "c.txt" and src.endswith(".patch")) or (dst == "a.txt" and src.endswith(".patch-old")):
            raise OSError(errno.EIO, "Input/output error")
        rename(src, dst, **fds)

    monkeypatch.setattr(patching.os, "rename", stuck)
    text = patch("*** Update File: a.txt", "-beta", "+BETA", "*** Delete File: b.txt", "*** Add File: c.txt", "+c")
    message = await failure(patches.apply_patch(text, BUDGET))
    assert message.startswith(f"Error: {ws}/c.txt: Input/output error; the patch was being written and could not be")
    kept = [name for name in os.listdir(ws) if name.startswith(".a.txt.") and name.endswith(".patch-old")]
    assert len(kept) == 1 and f"{ws}/a.txt (its old content is in {ws}/{kept[0]})" in message
    assert (ws / kept[0]).read_text() == "alpha\nbeta\n" and (ws / "a.txt").read_text() == "alpha\nBETA\n"
    assert (ws / "b.txt").read_text() == "bee\n" and not (ws / "c.txt").exists()


async def test_a_file_deleted_or_changed_after_it_was_read_refuses_the_whole_patch(
    patches: Patches, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = PatchOps._commit
    meddle: list[Any] = []

    def meddling(self: PatchOps, targets: list[Any]) -> None:
        meddle.pop()()
        commit(self, targets)

    monkeypatch.setattr(PatchOps, "_commit", meddling)
    seed(ws)
    text = patch("*** Update File: a.txt", "-beta", "+BETA", "*** Update File: b.txt", "-bee", "+BEE")
    for change, left in (
        (lambda: (ws / "b.txt").unlink(), None),  # deleted meanwhile: not brought back by the patch
        (lambda: (ws / "b.txt").write_text("a longer bee\n"), "a longer bee\n"),
    ):
        (ws / "b.txt").write_text("bee\n")
        meddle.append(change)
        message = await failure(patches.apply_patch(text, BUDGET))
        assert message == (
            f"Error: {ws}/b.txt: changed while the patch was applied, {UNCHANGED}; read it again and resend the patch"
        )
        assert (ws / "a.txt").read_text() == "alpha\nbeta\n"
        assert not [name for name in os.listdir(ws) if name.startswith(".")]
        assert ((ws / "b.txt").read_text() if (ws / "b.txt").exists() else None) == left


async def test_a_file_that_appears_before_the_write_is_not_overwritten(
    patches: Patches, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = PatchOps._commit

    def planting(self: PatchOps, targets: list[Any]) -> None:
        (ws / "new.txt").write_text("someone else's\n")
        commit(self, targets)

    monkeypatch.setattr(PatchOps, "_commit", planting)
    message = await failure(patches.apply_patch(patch("*** Add File: new.txt", "+mine"), BUDGET))
    assert message == f"Error: {ws}/new.txt: appeared while the patch was applied, {UNCHANGED}"
    assert tree(ws) == {"new.txt": "someone else's\n"}


async def test_a_diff_over_the_budget_is_cut_and_says_so(patches: Patches, ws: Path) -> None:
    text = patch("*** Add File: long.txt", *["+line"] * 5000)
    done = await patches.apply_patch(text, 4000)
    assert done["diff_truncated"] is True and len(done["text"]) <= 4000
    assert done["text"].startswith(f"Applied the patch to 1 file (+5000 -0):\nadded {ws}/long.txt (+5000)\n")
    assert done["text"].endswith("[diff cut to fit the result; git_diff or file_read shows the rest]\n")
    assert (ws / "long.txt").read_text() == "line\n" * 5000


async def test_no_file_of_a_patch_reaches_outside_while_a_directory_and_a_symlink_are_swapped(
    arena: race.Arena, racer: None
) -> None:
    ws, outside = arena.ws, arena.outside
    patches = Patches(ws)
    text = patch(
        "*** Add File: d/planted.txt",
        "+owned",
        "*** Update File: d/victim.txt",
        "-inside",
        "+patched",
        "*** Delete File: d/secret.txt",
        "*** Update File: d/made.txt",
        "*** Move to: d/sub/moved.txt",
    )
    deadline = time.monotonic() + race.RACE_SECONDS
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        os.close(os.open("made.txt", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=arena.inside))
        answer = await race.attempt(patches.apply_patch(text, BUDGET))
        assert race.SECRET not in answer and race.MARKER not in answer, (rounds, answer)
        assert race.outside_entries(outside) == race.OUTSIDE_ENTRIES, f"round {rounds}: changed outside"
        assert all((outside / name).read_text() == race.SECRET for name in race.OUTSIDE_ENTRIES), f"round {rounds}"
        race.refill(arena.inside)
    assert rounds > 10
