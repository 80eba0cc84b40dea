"""The executor's file operations: result texts, paging to a byte budget, and confinement to the workspace."""

from __future__ import annotations

import asyncio
import os
import re
import time
import tracemalloc
from collections.abc import Awaitable
from pathlib import Path

import pytest

from mcpserver.executor import listing, rlimits
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.files import FileOps
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.textsize import json_size
from tests.beneath_fixtures import resolution, ws  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio

BUDGET = 256 * 1024
NOTE = re.compile(r"offset=(\d+) to read on\]$")
CONTINUES = re.compile(
    r"^\[file continues: lines (\d+)-(\d+) \((\d+) bytes\) not shown; call file_read with offset=(\d+) to read on\]$"
)


class Files(FileOps):
    def __init__(self, root: Path) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment()


@pytest.fixture
def files(ws: Path) -> Files:
    return Files(ws)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("secret\n")
    return folder


async def failure(call: Awaitable[str]) -> str:
    with pytest.raises(ToolFailure) as caught:
        await call
    return str(caught.value)


async def assert_outside(call: Awaitable[str]) -> None:
    assert "is outside the allowed directory" in await failure(call)


def split_note(result: str) -> tuple[str, str]:
    body, _, note = result.rpartition("\n")
    return body + "\n", note


def big_text_lines(total_bytes: int) -> list[str]:
    """Numbered lines of varied length with characters JSON escapes (quote, backslash, tab, \\x01) and non-ASCII."""
    lines, size, number = [], 0, 0
    while size < total_bytes:
        number += 1
        line = f'{number:07d} "q" \\ \t \x01 é✓ ' + "x" * (number * 37 % 150) + "\n"
        lines.append(line)
        size += len(line.encode("utf-8"))
    return lines


# --- file_read ----------------------------------------------------------------------------------------------------


async def test_read_returns_a_small_file_unchanged(files: Files, ws: Path) -> None:
    (ws / "a.txt").write_bytes("one\r\ntwo\nthrée".encode())
    assert await files.read_file("a.txt", None, None, BUDGET) == "one\r\ntwo\nthrée"


async def test_read_decodes_invalid_utf8_with_replacement_characters(files: Files, ws: Path) -> None:
    (ws / "bad.txt").write_bytes(b"ok \xff\xfe end\n")
    assert await files.read_file("bad.txt", None, None, BUDGET) == "ok \ufffd\ufffd end\n"


async def test_read_of_an_empty_file_is_empty_text(files: Files, ws: Path) -> None:
    (ws / "empty").write_bytes(b"")
    assert await files.read_file("empty", None, None, BUDGET) == ""


async def test_read_of_a_missing_file_is_an_error(files: Files, ws: Path) -> None:
    message = await failure(files.read_file("nope.txt", None, None, BUDGET))
    assert message == f"Error: {ws / 'nope.txt'}: No such file or directory"


async def test_read_of_a_directory_is_an_error(files: Files, ws: Path) -> None:
    (ws / "d").mkdir()
    assert await failure(files.read_file("d", None, None, BUDGET)) == f"Error: {ws / 'd'}: Is a directory"


async def test_read_of_a_fifo_fails_instead_of_blocking(files: Files, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    assert await failure(files.read_file("pipe", None, None, BUDGET)) == f"Error: {ws / 'pipe'}: Not a regular file"


async def test_read_of_a_binary_file_reports_its_size_and_type(files: Files, ws: Path) -> None:
    (ws / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + b"z" * 90)
    (ws / "blob").write_bytes(b"abc\x00def")
    png = await files.read_file("image.png", None, None, BUDGET)
    assert png == f"Binary file {ws / 'image.png'}: 100 bytes (image/png); not shown as text"
    blob = await files.read_file("blob", 1, 5, BUDGET)
    assert blob == f"Binary file {ws / 'blob'}: 7 bytes (application/octet-stream); not shown as text"


async def test_read_with_offset_and_limit_returns_those_lines_and_says_where_to_go_on(files: Files, ws: Path) -> None:
    (ws / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = await files.read_file("n.txt", 3, 4, BUDGET)
    assert result == "line 3\nline 4\nline 5\nline 6\n[lines 3-6 of 10; call file_read with offset=7 to read on]"


async def test_read_of_a_page_that_reaches_the_end_has_no_note(files: Files, ws: Path) -> None:
    (ws / "n.txt").write_text("a\nb\nc")
    assert await files.read_file("n.txt", 2, None, BUDGET) == "b\nc"
    assert await files.read_file("n.txt", 2, 2, BUDGET) == "b\nc"
    assert await files.read_file("n.txt", 3, 50, BUDGET) == "c"


async def test_read_with_an_offset_past_the_end_is_an_error(files: Files, ws: Path) -> None:
    (ws / "n.txt").write_text("a\nb\nc\n")
    assert await failure(files.read_file("n.txt", 4, None, BUDGET)) == f"Error: {ws / 'n.txt'} has only 3 lines"
    (ws / "m.txt").write_text("a\nb")
    assert await failure(files.read_file("m.txt", 3, 1, BUDGET)) == f"Error: {ws / 'm.txt'} has only 2 lines"


@pytest.mark.parametrize(("offset", "limit", "word"), [(0, None, "offset"), (-3, 5, "offset"), (1, 0, "limit")])
async def test_read_refuses_an_offset_or_limit_below_one(
    files: Files, ws: Path, offset: int, limit: int | None, word: str
) -> None:
    (ws / "n.txt").write_text("a\n")
    message = await failure(files.read_file("n.txt", offset, limit, BUDGET))
    assert message.startswith(f"Error: {word} must be 1 or more")


async def test_read_of_a_10mb_file_without_offset_stays_within_the_budget(files: Files, ws: Path) -> None:
    lines = big_text_lines(10 * 1024 * 1024)
    (ws / "big.txt").write_text("".join(lines))
    result = await files.read_file("big.txt", None, None, BUDGET)
    assert json_size(result) <= BUDGET
    assert json_size(result) > BUDGET - 1024  # the budget is used, not wasted
    body, note = split_note(result)
    shown = body.splitlines(keepends=True)
    assert shown == lines[: len(shown)]
    match = CONTINUES.match(note)
    assert match is not None, note
    next_line, total, remaining, offset = map(int, match.groups())
    assert (next_line, total, offset) == (len(shown) + 1, len(lines), len(shown) + 1)
    assert remaining == sum(len(line.encode()) for line in lines[len(shown) :])


@pytest.mark.parametrize("limit", [None, 2500])
async def test_a_10mb_file_read_page_by_page_comes_back_whole_and_in_order(
    files: Files, ws: Path, limit: int | None
) -> None:
    lines = big_text_lines(10 * 1024 * 1024)
    (ws / "big.txt").write_text("".join(lines))
    pieces, offset, pages = [], 1, 0
    while True:
        result = await files.read_file("big.txt", offset, limit, BUDGET)
        assert json_size(result) <= BUDGET
        pages += 1
        match = NOTE.search(result)
        if match is None:
            pieces.append(result)
            break
        body, _ = split_note(result)
        shown = body.count("\n")
        assert int(match.group(1)) == offset + shown  # the note names the first line not shown
        if limit is not None:
            assert shown <= limit
        pieces.append(body)
        offset += shown
    assert "".join(pieces) == "".join(lines)
    assert pages > 10


async def test_read_with_a_limit_uses_the_lines_of_note_when_the_page_fits(files: Files, ws: Path) -> None:
    lines = big_text_lines(1024 * 1024)
    (ws / "big.txt").write_text("".join(lines))
    result = await files.read_file("big.txt", 101, 100, BUDGET)
    body, note = split_note(result)
    assert body == "".join(lines[100:200])
    assert note == f"[lines 101-200 of {len(lines)}; call file_read with offset=201 to read on]"


async def test_a_line_longer_than_the_budget_is_cut_and_the_note_says_so(files: Files, ws: Path) -> None:
    (ws / "long.txt").write_text("short\n" + "é" * 50_000 + "\nafter\nend\n")
    result = await files.read_file("long.txt", 2, None, 8192)
    assert json_size(result) <= 8192
    head, cut_note, continues = result.rsplit("\n", 2)
    assert head and set(head) == {"é"}
    assert cut_note == f"[line 2 is 100001 bytes, over the budget: only its first {len(head.encode())} bytes are shown]"
    assert continues == "[file continues: lines 3-4 (10 bytes) not shown; call file_read with offset=3 to read on]"


async def test_a_long_first_line_is_cut_when_read_without_offset(files: Files, ws: Path) -> None:
    (ws / "one.txt").write_text("y" * 20_000)
    result = await files.read_file("one.txt", None, None, 4096)
    head, note = result.split("\n")
    assert set(head) == {"y"} and json_size(result) <= 4096
    assert note.startswith("[line 1 is 20000 bytes, over the budget")


async def test_read_of_a_huge_file_streams_instead_of_loading_it_whole(files: Files, ws: Path) -> None:
    # 16 KiB of text then a 256 MiB hole (NUL bytes with no newline): one giant last line, cheap on disk.
    path = ws / "huge.log"
    with path.open("wb") as f:
        f.write(b"".join(b"row %05d\n" % i for i in range(1, 1821)))
        f.truncate(256 * 1024 * 1024)
    tracemalloc.start()
    try:
        first = await files.read_file("huge.log", None, None, 8192)
        last = await files.read_file("huge.log", 1821, None, 8192)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024
    assert first.startswith("row 00001\nrow 00002\n")
    match = CONTINUES.match(first.splitlines()[-1])
    assert match is not None and match.group(2) == "1821"
    assert int(match.group(3)) == 256 * 1024 * 1024 - 10 * (int(match.group(1)) - 1)
    assert f"[line 1821 is {256 * 1024 * 1024 - 1820 * 10} bytes, over the budget" in last


# --- file_write ---------------------------------------------------------------------------------------------------


async def test_write_creates_parents_and_reports_the_characters_written(files: Files, ws: Path) -> None:
    result = await files.write_file("new/deep/f.txt", "héllo ✓\n")
    assert result == f"Written 8 bytes to {ws / 'new/deep/f.txt'}"
    assert (ws / "new/deep/f.txt").read_bytes() == "héllo ✓\n".encode()


async def test_write_replaces_the_whole_previous_content(files: Files, ws: Path) -> None:
    (ws / "f.txt").write_text("a much longer previous content\n")
    await files.write_file("f.txt", "short")
    assert (ws / "f.txt").read_text() == "short"


async def test_write_to_a_directory_is_an_error(files: Files, ws: Path) -> None:
    (ws / "d").mkdir()
    assert await failure(files.write_file("d", "x")) == f"Error: {ws / 'd'}: Is a directory"


async def test_write_of_text_with_a_lone_surrogate_is_an_error(files: Files, ws: Path) -> None:
    assert (await failure(files.write_file("s.txt", "a\ud800b"))).startswith("Error: content is not valid Unicode")
    assert not (ws / "s.txt").exists()


# --- file_delete --------------------------------------------------------------------------------------------------


async def test_delete_removes_a_file_and_names_it(files: Files, ws: Path) -> None:
    (ws / "f.txt").write_text("x")
    assert await files.delete_file("f.txt") == f"Deleted {ws / 'f.txt'}"
    assert not (ws / "f.txt").exists()


async def test_delete_of_a_missing_file_is_not_an_error(files: Files, ws: Path) -> None:
    assert await files.delete_file("ghost.txt") == f"Deleted {ws / 'ghost.txt'}"
    assert await files.delete_file("no/such/dir/ghost.txt") == f"Deleted {ws / 'no/such/dir/ghost.txt'}"


async def test_delete_of_a_directory_is_an_error(files: Files, ws: Path) -> None:
    (ws / "d").mkdir()
    assert await failure(files.delete_file("d")) == f"Error: {ws / 'd'}: Is a directory"
    assert (ws / "d").is_dir()


async def test_delete_of_a_symlink_removes_the_link_not_its_target(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-secret").symlink_to(outside / "secret.txt")
    (ws / "to-outdir").symlink_to(outside)
    (ws / "real.txt").write_text("kept")
    (ws / "to-real").symlink_to(ws / "real.txt")
    for name in ("to-secret", "to-outdir", "to-real"):
        assert await files.delete_file(name) == f"Deleted {ws / name}"
        assert not os.path.lexists(ws / name)
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert (ws / "real.txt").read_text() == "kept"


async def test_delete_of_a_dangling_symlink_pointing_outside_removes_the_link(
    files: Files, ws: Path, outside: Path
) -> None:
    (ws / "dangling").symlink_to(outside / "missing")
    assert await files.delete_file("dangling") == f"Deleted {ws / 'dangling'}"
    assert not os.path.lexists(ws / "dangling")


@pytest.mark.parametrize("path", ["", ".", "./", "..", "sub/..", "sub/.", "/"])
async def test_delete_refuses_the_workspace_root_and_dot_paths(files: Files, ws: Path, path: str) -> None:
    (ws / "sub").mkdir()
    assert "will not delete" in await failure(files.delete_file(path))
    assert (ws / "sub").is_dir()


async def test_delete_refuses_the_workspace_root_named_absolutely(files: Files, ws: Path) -> None:
    assert await failure(files.delete_file(str(ws))) == f"Error: {ws}: will not delete the workspace root"


# --- file_list ----------------------------------------------------------------------------------------------------


async def test_list_is_a_long_listing_like_ls_la(files: Files, ws: Path) -> None:
    (ws / "alpha.txt").write_text("12345")
    (ws / "beta").mkdir()
    result = await files.list_dir("", False)
    assert result.startswith("total ")
    rows = result.splitlines()
    assert any(row.startswith("-") and row.endswith(" alpha.txt") and " 5 " in row for row in rows)
    assert any(row.startswith("d") and row.endswith(" beta") for row in rows)
    assert any(row.endswith(" ..") for row in rows)


async def test_list_of_a_missing_path_or_a_file_is_an_error(files: Files, ws: Path) -> None:
    (ws / "f.txt").write_text("x")
    assert await failure(files.list_dir("nope", False)) == f"Error: {ws / 'nope'}: No such file or directory"
    assert await failure(files.list_dir("f.txt", True)) == f"Error: {ws / 'f.txt'}: Not a directory"
    assert await failure(files.list_dir("f.txt", False)) == f"Error: {ws / 'f.txt'}: Not a directory"


def fake_ls(files: Files, tmp_path: Path, script: str) -> None:
    """An `ls` first on the tools' PATH that runs `script` (sh) instead of listing."""
    directory = tmp_path / "fake-bin"
    directory.mkdir()
    (directory / "ls").write_text(f"#!/bin/sh\n{script}\n")
    (directory / "ls").chmod(0o755)
    files.env = {**files.env, "PATH": f"{directory}:{files.env['PATH']}"}


def record_spawns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids the tool limits are pinned in (every process started through the executor's spawn path)."""
    pinned: list[int] = []
    monkeypatch.setattr(rlimits.keeper, "pin", pinned.append)
    return pinned


async def group_gone(pgid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_listing_runs_under_the_tool_limits_like_every_command(
    files: Files, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = record_spawns(monkeypatch)
    assert (await files.list_dir("", False)).startswith("total ")
    assert len(pinned) == 1


async def test_a_failing_listing_shows_what_ls_wrote_on_either_stream_in_order(
    files: Files, ws: Path, tmp_path: Path
) -> None:
    fake_ls(files, tmp_path, "echo first; echo second >&2; echo third; exit 2")
    assert await failure(files.list_dir("", False)) == "Error: first\nsecond\nthird"
    fake_ls_quiet = tmp_path / "fake-bin" / "ls"
    fake_ls_quiet.write_text("#!/bin/sh\nexit 3\n")
    assert await failure(files.list_dir("", False)) == "Error: ls exited with status 3"


async def test_a_listing_past_its_size_cap_is_cut_and_its_ls_ended(
    files: Files, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ls(files, tmp_path, "yes x")  # never ends by itself
    monkeypatch.setattr(listing, "LS_OUTPUT_CAP", 100)
    pinned = record_spawns(monkeypatch)
    assert await files.list_dir("", False) == "x\n" * 50 + "\n[listing cut at 100 bytes]"
    assert await group_gone(pinned[0])


async def test_a_listing_past_its_timeout_fails_and_leaves_no_process_behind(
    files: Files, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ls(files, tmp_path, "sleep 60 & sleep 60")  # a child in its group too
    monkeypatch.setattr(listing, "LS_TIMEOUT", 0.3)
    pinned = record_spawns(monkeypatch)
    assert await failure(files.list_dir("", False)) == f"Error: listing {ws} took longer than 0 s"
    assert await group_gone(pinned[0])


async def test_a_cancelled_listing_leaves_no_process_behind(
    files: Files, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ls(files, tmp_path, "sleep 60")
    pinned = record_spawns(monkeypatch)
    listing = asyncio.ensure_future(files.list_dir("", False))
    deadline = time.monotonic() + 10
    while not pinned and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    listing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await listing
    assert await group_gone(pinned[0])


async def test_recursive_listing_is_sorted_relative_with_slashes_on_directories(files: Files, ws: Path) -> None:
    (ws / "src/pkg").mkdir(parents=True)
    (ws / "src/pkg/mod.py").write_text("")
    (ws / "src/main.py").write_text("")
    (ws / "README").write_text("")
    (ws / "empty").mkdir()
    result = await files.list_dir("", True)
    assert result.splitlines() == ["README", "empty/", "src/", "src/main.py", "src/pkg/", "src/pkg/mod.py"]
    assert await files.list_dir("src", True) == "main.py\npkg/\npkg/mod.py"


async def test_recursive_listing_skips_git_and_node_modules(files: Files, ws: Path) -> None:
    for folder in (".git/objects", "node_modules/left-pad", "app/node_modules/x"):
        (ws / folder).mkdir(parents=True)
        (ws / folder / "file").write_text("")
    (ws / "app/index.js").write_text("")
    assert await files.list_dir("", True) == "app/\napp/index.js"


async def test_recursive_listing_goes_five_levels_deep(files: Files, ws: Path) -> None:
    (ws / "1/2/3/4/5/6/7").mkdir(parents=True)
    (ws / "1/2/3/4/f5").write_text("")
    (ws / "1/2/3/4/5/f6").write_text("")
    expected = ["1/", "1/2/", "1/2/3/", "1/2/3/4/", "1/2/3/4/5/", "1/2/3/4/f5"]
    assert (await files.list_dir("", True)).splitlines() == expected


async def test_recursive_listing_is_cut_at_500_lines(files: Files, ws: Path) -> None:
    for i in range(600):
        (ws / f"f{i:04d}").write_text("")
    lines = (await files.list_dir("", True)).splitlines()
    assert len(lines) == 501
    assert lines[:2] == ["f0000", "f0001"] and lines[499] == "f0499"
    assert lines[500] == "[listing cut at 500 lines]"


async def test_recursive_listing_of_exactly_500_entries_is_not_cut(files: Files, ws: Path) -> None:
    for i in range(500):
        (ws / f"f{i:04d}").write_text("")
    lines = (await files.list_dir("", True)).splitlines()
    assert len(lines) == 500 and lines[-1] == "f0499"


async def test_recursive_listing_does_not_follow_symlinked_directories(files: Files, ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside)
    (ws / "inner").mkdir()
    (ws / "inner-link").symlink_to(ws / "inner")
    (ws / "inner/x").write_text("")
    assert await files.list_dir("", True) == "inner/\ninner/x\ninner-link\nlink"


async def test_recursive_listing_of_an_empty_directory_says_empty(files: Files, ws: Path) -> None:
    (ws / "void").mkdir()
    assert await files.list_dir("void", True) == "(empty)"


# --- file_move ----------------------------------------------------------------------------------------------------


async def test_move_renames_and_creates_the_destination_parent(files: Files, ws: Path) -> None:
    (ws / "a.txt").write_text("A")
    assert await files.move("a.txt", "x/y/b.txt") == f"Moved {ws / 'a.txt'} \u2192 {ws / 'x/y/b.txt'}"
    assert (ws / "x/y/b.txt").read_text() == "A" and not (ws / "a.txt").exists()


async def test_move_into_an_existing_directory_keeps_the_name(files: Files, ws: Path) -> None:
    (ws / "a.txt").write_text("A")
    (ws / "box").mkdir()
    assert await files.move("a.txt", "box") == f"Moved {ws / 'a.txt'} → {ws / 'box/a.txt'}"
    assert (ws / "box/a.txt").read_text() == "A"


async def test_move_of_a_directory_works(files: Files, ws: Path) -> None:
    (ws / "d/sub").mkdir(parents=True)
    (ws / "d/sub/f").write_text("F")
    assert await files.move("d", "e") == f"Moved {ws / 'd'} → {ws / 'e'}"
    assert (ws / "e/sub/f").read_text() == "F"


async def test_move_of_a_missing_source_is_an_error(files: Files, ws: Path) -> None:
    assert await failure(files.move("ghost", "b")) == f"Error: {ws / 'ghost'}: No such file or directory"


async def test_move_of_a_symlink_moves_the_link_not_its_target(files: Files, ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret.txt")
    await files.move("link", "moved-link")
    assert os.readlink(ws / "moved-link") == str(outside / "secret.txt")
    assert (outside / "secret.txt").read_text() == "secret\n" and (outside / "secret.txt").is_file()


async def test_move_onto_a_symlink_replaces_the_link_not_its_target(files: Files, ws: Path) -> None:
    (ws / "target.txt").write_text("target")
    (ws / "link").symlink_to(ws / "target.txt")
    (ws / "new.txt").write_text("new")
    assert await files.move("new.txt", "link") == f"Moved {ws / 'new.txt'} → {ws / 'link'}"
    assert not (ws / "link").is_symlink() and (ws / "link").read_text() == "new"
    assert (ws / "target.txt").read_text() == "target"


@pytest.mark.parametrize("source", ["", ".", "..", str(Path("/"))])
async def test_move_refuses_to_move_the_workspace_root(files: Files, ws: Path, source: str) -> None:
    assert "will not move" in await failure(files.move(source, "elsewhere"))
    assert not (ws / "elsewhere").exists()


async def test_move_refuses_the_workspace_root_named_absolutely(files: Files, ws: Path) -> None:
    assert await failure(files.move(str(ws), "x")) == f"Error: {ws}: will not move the workspace root"


# --- file_mkdir ---------------------------------------------------------------------------------------------------


async def test_mkdir_creates_parents_and_is_fine_if_it_exists(files: Files, ws: Path) -> None:
    assert await files.mkdir("a/b/c") == f"Created directory {ws / 'a/b/c'}"
    assert (ws / "a/b/c").is_dir()
    assert await files.mkdir("a/b/c") == f"Created directory {ws / 'a/b/c'}"


async def test_mkdir_over_a_file_is_an_error(files: Files, ws: Path) -> None:
    (ws / "f").write_text("x")
    assert await failure(files.mkdir("f")) == f"Error: {ws / 'f'}: File exists"


# --- confinement --------------------------------------------------------------------------------------------------


async def test_symlink_out_of_workspace_is_refused_for_read(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-secret").symlink_to(outside / "secret.txt")
    (ws / "to-outdir").symlink_to(outside)
    await assert_outside(files.read_file("to-secret", None, None, BUDGET))
    await assert_outside(files.read_file("to-outdir/secret.txt", 1, 1, BUDGET))


async def test_symlink_out_of_workspace_is_refused_for_write(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-secret").symlink_to(outside / "secret.txt")
    (ws / "to-outdir").symlink_to(outside)
    await assert_outside(files.write_file("to-secret", "owned"))
    await assert_outside(files.write_file("to-outdir/new/planted.txt", "owned"))
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_dangling_symlink_pointing_outside_is_refused(files: Files, ws: Path, outside: Path) -> None:
    (ws / "dangling").symlink_to(outside / "planted")
    await assert_outside(files.write_file("dangling", "owned"))
    await assert_outside(files.mkdir("dangling"))
    await assert_outside(files.read_file("dangling", None, None, BUDGET))
    (ws / "a.txt").write_text("A")
    await assert_outside(files.move("a.txt", "dangling"))
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (ws / "a.txt").read_text() == "A"


async def test_symlink_out_of_workspace_is_refused_for_list(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-outdir").symlink_to(outside)
    await assert_outside(files.list_dir("to-outdir", False))
    await assert_outside(files.list_dir("to-outdir", True))


async def test_symlink_out_of_workspace_is_refused_for_delete(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-outdir").symlink_to(outside)
    await assert_outside(files.delete_file("to-outdir/secret.txt"))
    assert (outside / "secret.txt").exists()


async def test_move_source_through_a_symlinked_directory_out_of_workspace_is_refused(
    files: Files, ws: Path, outside: Path
) -> None:
    (ws / "to-outdir").symlink_to(outside)
    await assert_outside(files.move("to-outdir/secret.txt", "stolen.txt"))
    assert (outside / "secret.txt").exists() and not (ws / "stolen.txt").exists()


async def test_move_destination_out_of_workspace_is_refused(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-outdir").symlink_to(outside)
    (ws / "a.txt").write_text("A")
    await assert_outside(files.move("a.txt", "to-outdir"))
    await assert_outside(files.move("a.txt", "to-outdir/a.txt"))
    await assert_outside(files.move("a.txt", str(outside / "a.txt")))
    await assert_outside(files.move("a.txt", "../outside/a.txt"))
    assert (ws / "a.txt").read_text() == "A"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_symlink_out_of_workspace_is_refused_for_mkdir(files: Files, ws: Path, outside: Path) -> None:
    (ws / "to-outdir").symlink_to(outside)
    await assert_outside(files.mkdir("to-outdir/new"))
    assert not (outside / "new").exists()


async def test_dotdot_escapes_are_refused_everywhere(files: Files, ws: Path, outside: Path) -> None:
    (ws / "a.txt").write_text("A")
    await assert_outside(files.read_file("../outside/secret.txt", None, None, BUDGET))
    await assert_outside(files.read_file(str(outside / "secret.txt"), None, None, BUDGET))
    await assert_outside(files.write_file("sub/../../outside/secret.txt", "owned"))
    await assert_outside(files.delete_file("../outside/secret.txt"))
    await assert_outside(files.list_dir("..", False))
    await assert_outside(files.list_dir("../outside", True))
    await assert_outside(files.mkdir("../outside/new"))
    await assert_outside(files.move("../outside/secret.txt", "stolen"))
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_a_directory_swapped_for_a_link_out_after_the_check_is_refused(ws: Path, outside: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d/f.txt").write_text("inside")
    workspace = Workspace(ws)
    checked = workspace.resolve("d/f.txt")
    (ws / "d").rename(ws / "was-d")
    (ws / "d").symlink_to(outside)  # as a racer would, between the check and the use
    (outside / "f.txt").write_text("outside")
    for open_it in (
        lambda: workspace.open(checked, os.O_RDONLY),
        lambda: workspace.open_dir(checked.parent),
        lambda: workspace.make_dirs(checked.parent / "new"),
    ):
        with pytest.raises(ToolFailure, match="is outside the allowed directory"):
            open_it()
    assert sorted(os.listdir(outside)) == ["f.txt", "secret.txt"]


def test_a_link_swapped_in_that_stays_inside_is_followed_with_openat2_and_refused_by_the_walk(
    ws: Path, resolution: str
) -> None:
    (ws / "d").mkdir()
    (ws / "other").mkdir()
    (ws / "other/f.txt").write_text("other")
    workspace = Workspace(ws)
    checked = workspace.resolve("d/f.txt")
    (ws / "d").rmdir()
    (ws / "d").symlink_to("other")
    if resolution == "openat2":  # resolved beneath the root, like a link that was there all along
        fd = workspace.open(checked, os.O_RDONLY)
        assert os.read(fd, 100) == b"other"
        os.close(fd)
    else:  # the walk follows no link at all: the path changed since it was checked, so it is refused
        with pytest.raises(ToolFailure, match="is outside the allowed directory"):
            workspace.open(checked, os.O_RDONLY)


async def test_a_workspace_root_that_is_itself_a_symlink_works(tmp_path: Path, ws: Path) -> None:
    (tmp_path / "root-link").symlink_to(ws)
    linked = Files(tmp_path / "root-link")
    assert linked.root == str(ws)
    assert await linked.write_file("f.txt", "hi\n") == f"Written 3 bytes to {ws / 'f.txt'}"
    assert await linked.read_file(str(tmp_path / "root-link/f.txt"), None, None, BUDGET) == "hi\n"
    assert await linked.mkdir("d") == f"Created directory {ws / 'd'}"
    assert await linked.move(str(tmp_path / "root-link/f.txt"), "d") == f"Moved {ws / 'f.txt'} → {ws / 'd/f.txt'}"
    assert await linked.list_dir("", True) == "d/\nd/f.txt"
    assert "f.txt" in await linked.list_dir("d", False)
    assert await linked.delete_file("d/f.txt") == f"Deleted {ws / 'd/f.txt'}"
    assert not (ws / "d/f.txt").exists()
