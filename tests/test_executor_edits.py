"""The executor's edit operation (mcpserver/executor/editing.py): what it keeps of the file, what it refuses, and
that a failed edit leaves nothing behind."""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from mcpserver.executor import editing
from mcpserver.executor.editing import EditOps
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace
from tests.beneath_fixtures import resolution, ws  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio

BUDGET = 256 * 1024


class Edits(EditOps):
    def __init__(self, root: Path) -> None:
        self.workspace = Workspace(root)


@pytest.fixture
def edits(ws: Path) -> Edits:
    return Edits(ws)


def one(old: str, new: str, replace_all: bool = False) -> list[dict[str, Any]]:
    return [{"old_string": old, "new_string": new, "replace_all": replace_all}]


async def failure(call: Awaitable[object]) -> str:
    with pytest.raises(ToolFailure) as caught:
        await call
    return str(caught.value)


def entries(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


async def test_an_edit_rewrites_the_file_and_returns_the_diff_and_count(edits: Edits, ws: Path) -> None:
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    done = await edits.edit_file("a.txt", one("two", "2"), BUDGET)
    assert (ws / "a.txt").read_text() == "one\n2\nthree\n"
    assert done == {
        "path": str(ws / "a.txt"),
        "diff": f"--- {ws}/a.txt\n+++ {ws}/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n",
        "replacements": 1,
        "diff_truncated": False,
    }
    assert entries(ws) == ["a.txt"]


async def test_the_mode_and_owner_of_the_file_are_kept(edits: Edits, ws: Path) -> None:
    target = ws / "run.sh"
    target.write_text("echo hi\n")
    target.chmod(0o751)
    before = target.stat()
    await edits.edit_file(str(target), one("hi", "there"), BUDGET)
    after = target.stat()
    assert stat.S_IMODE(after.st_mode) == 0o751
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert after.st_ino != before.st_ino  # replaced by rename, not rewritten in place


async def test_a_crlf_file_keeps_its_endings_and_a_bom_is_kept(edits: Edits, ws: Path) -> None:
    target = ws / "win.txt"
    target.write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    await edits.edit_file("win.txt", one("one\ntwo", "uno\ndos"), BUDGET)
    assert target.read_bytes() == b"\xef\xbb\xbfuno\r\ndos\r\n"


async def test_a_binary_file_is_refused_whether_by_nul_byte_or_invalid_utf8(edits: Edits, ws: Path) -> None:
    (ws / "nul.bin").write_bytes(b"abc\x00def")
    (ws / "latin.txt").write_bytes(b"caf\xe9\n")
    assert (
        await failure(edits.edit_file("nul.bin", one("abc", "x"), BUDGET))
        == f"Error: {ws}/nul.bin: binary file, not edited"
    )
    assert "binary file (not valid UTF-8), not edited" in await failure(
        edits.edit_file("latin.txt", one("caf", "x"), BUDGET)
    )
    assert (ws / "latin.txt").read_bytes() == b"caf\xe9\n"


async def test_a_symlink_out_of_the_workspace_and_dotdot_are_refused(edits: Edits, ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("password=1\n")
    (ws / "link.txt").symlink_to(secret)
    assert "is outside the allowed directory" in await failure(edits.edit_file("link.txt", one("1", "2"), BUDGET))
    assert "is outside the allowed directory" in await failure(edits.edit_file("../secret.txt", one("1", "2"), BUDGET))
    assert secret.read_text() == "password=1\n"


async def test_a_symlink_inside_the_workspace_edits_its_target_and_stays_a_link(edits: Edits, ws: Path) -> None:
    (ws / "real.txt").write_text("x = 1\n")
    (ws / "alias.txt").symlink_to("real.txt")
    done = await edits.edit_file("alias.txt", one("1", "2"), BUDGET)
    assert done["path"] == str(ws / "real.txt")
    assert (ws / "alias.txt").is_symlink() and (ws / "real.txt").read_text() == "x = 2\n"


async def test_a_fifo_or_a_directory_is_refused_without_blocking(edits: Edits, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    (ws / "dir").mkdir()
    assert (
        await failure(edits.edit_file("pipe", one("a", "b"), BUDGET))
        == f"Error: {ws}/pipe: Not a regular file, not edited"
    )
    assert "Is a directory" in await failure(edits.edit_file("dir", one("a", "b"), BUDGET))
    assert "Is a directory" in await failure(edits.edit_file("", one("a", "b"), BUDGET))


async def test_a_missing_file_is_an_error(edits: Edits, ws: Path) -> None:
    assert (
        await failure(edits.edit_file("nope.txt", one("a", "b"), BUDGET))
        == f"Error: {ws}/nope.txt: No such file or directory"
    )


async def test_a_file_over_the_limit_is_refused(edits: Edits, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(editing, "MAX_EDIT_BYTES", 1024)
    (ws / "big.txt").write_text("a" * 2000)
    assert f"Error: {ws}/big.txt: 2000 bytes, over file_edit's limit of 1024" in await failure(
        edits.edit_file("big.txt", one("a", "b", True), BUDGET)
    )


async def test_a_multi_edit_with_a_failing_edit_writes_nothing(edits: Edits, ws: Path) -> None:
    target = ws / "m.txt"
    target.write_text("alpha\nbeta\n")
    steps = [{"old_string": "alpha", "new_string": "A"}, {"old_string": "gamma", "new_string": "G"}]
    assert (await failure(edits.edit_file("m.txt", steps, BUDGET))).startswith("Error: edit 2 of 2: ")
    assert target.read_text() == "alpha\nbeta\n" and entries(ws) == ["m.txt"]


async def test_a_failed_write_leaves_no_temporary_file_and_the_original_intact(
    edits: Edits, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = ws / "keep.txt"
    target.write_text("old\n")

    def broken_rename(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(editing.os, "rename", broken_rename)
    assert (
        await failure(edits.edit_file("keep.txt", one("old", "new"), BUDGET))
        == f"Error: {target}: No space left on device"
    )
    assert entries(ws) == ["keep.txt"] and target.read_text() == "old\n"


async def test_a_diff_over_the_budget_is_cut_and_says_so(edits: Edits, ws: Path) -> None:
    (ws / "long.txt").write_text("x\n" * 5000)
    done = await edits.edit_file("long.txt", one("x", "y", True), 2000)
    assert done["diff_truncated"] is True and done["replacements"] == 5000
    assert len(done["diff"]) <= 2000 and done["diff"].endswith("to see all of it]\n")
    assert (ws / "long.txt").read_text() == "y\n" * 5000


async def test_a_file_with_a_name_of_255_bytes_is_edited(edits: Edits, ws: Path) -> None:
    name = "é" * 127 + "x"  # 255 bytes of UTF-8: the temporary name must be cut in bytes to fit
    (ws / name).write_text("a\n")
    await edits.edit_file(name, one("a", "b"), BUDGET)
    assert (ws / name).read_text() == "b\n" and entries(ws) == [name]
