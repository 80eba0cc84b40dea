"""The six file tools over MCP against the live server: result texts, errors, paging, and symlink confinement."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from mcp import Client

from tests.live import LiveServer, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

RESULT_CAP = 262144
OUTSIDE = "is outside the allowed directory"


def rel(live_server: LiveServer, path: Path) -> str:
    return str(path.relative_to(live_server.workspace))


async def call(client: Client, tool: str, **arguments: object) -> tuple[str, bool]:
    result = await client.call_tool(tool, arguments)
    return text_of(result), bool(result.is_error)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under `root`: a file's bytes, or None for a directory."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))
    }


# --- success and failure of each tool --------------------------------------------------------------------------------


async def test_file_write_creates_parents_and_file_read_returns_the_content(
    tools_client: Client, live_server: LiveServer, workspace_dir: Path
) -> None:
    target = workspace_dir / "deep" / "er" / "notes.txt"
    content = "first line\nsecond line: héllo\n"
    assert await call(tools_client, "file_write", path=rel(live_server, target), content=content) == (
        f"Written {len(content)} bytes to {target}",
        False,
    )
    assert target.read_text() == content
    assert await call(tools_client, "file_read", path=str(target)) == (content, False)


async def test_file_read_of_a_missing_file_or_a_directory_is_an_error(
    tools_client: Client, workspace_dir: Path
) -> None:
    missing = workspace_dir / "missing.txt"
    assert await call(tools_client, "file_read", path=str(missing)) == (
        f"Error: {missing}: No such file or directory",
        True,
    )
    assert await call(tools_client, "file_read", path=str(workspace_dir)) == (
        f"Error: {workspace_dir}: Is a directory",
        True,
    )


async def test_file_read_of_a_binary_file_says_so_instead_of_returning_mojibake(
    tools_client: Client, workspace_dir: Path
) -> None:
    blob = workspace_dir / "blob.bin"
    blob.write_bytes(b"\x00\x01\x02binary\xff" * 100)
    text, is_error = await call(tools_client, "file_read", path=str(blob))
    assert not is_error
    assert text.startswith(f"Binary file {blob}: 1000 bytes")


async def test_file_write_outside_the_workspace_is_refused(
    tools_client: Client, live_server: LiveServer, tmp_path: Path
) -> None:
    target = tmp_path / "escaped.txt"
    text, is_error = await call(tools_client, "file_write", path=str(target), content="x")
    assert is_error and OUTSIDE in text
    text, is_error = await call(tools_client, "file_write", path="../escaped-too.txt", content="x")
    assert is_error and OUTSIDE in text
    assert not target.exists() and not (live_server.workspace.parent / "escaped-too.txt").exists()


async def test_file_delete_deletes_a_file_and_a_missing_file_is_not_an_error(
    tools_client: Client, workspace_dir: Path
) -> None:
    victim = workspace_dir / "victim.txt"
    victim.write_text("bye")
    assert await call(tools_client, "file_delete", path=str(victim)) == (f"Deleted {victim}", False)
    assert not victim.exists()
    assert await call(tools_client, "file_delete", path=str(victim)) == (f"Deleted {victim}", False)


async def test_file_delete_of_a_directory_is_an_error(tools_client: Client, workspace_dir: Path) -> None:
    (workspace_dir / "keep").mkdir()
    text, is_error = await call(tools_client, "file_delete", path=str(workspace_dir / "keep"))
    assert (text, is_error) == (f"Error: {workspace_dir / 'keep'}: Is a directory", True)
    assert (workspace_dir / "keep").is_dir()


async def test_file_list_gives_a_long_listing_and_a_recursive_tree_without_git_and_node_modules(
    tools_client: Client, workspace_dir: Path
) -> None:
    for name in ("a/b.txt", "c.txt", "node_modules/dep/index.js", ".git/HEAD", "a/.git/config"):
        (workspace_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace_dir / name).write_text("x")
    text, is_error = await call(tools_client, "file_list", path=str(workspace_dir))
    lines = text.splitlines()
    assert not is_error and lines[0].startswith("total ")
    assert {line.split()[-1] for line in lines[1:]} == {".", "..", ".git", "a", "c.txt", "node_modules"}
    assert all(re.match(r"[d-][rwx-]{9}", line) for line in lines[1:])
    assert await call(tools_client, "file_list", path=str(workspace_dir), recursive=True) == (
        "a/\na/b.txt\nc.txt",
        False,
    )


async def test_file_list_of_a_missing_directory_is_an_error(tools_client: Client, workspace_dir: Path) -> None:
    missing = workspace_dir / "nope"
    assert await call(tools_client, "file_list", path=str(missing)) == (
        f"Error: {missing}: No such file or directory",
        True,
    )


async def test_file_move_renames_and_creates_the_destination_parent(tools_client: Client, workspace_dir: Path) -> None:
    source, dest = workspace_dir / "from.txt", workspace_dir / "new" / "parent" / "to.txt"
    source.write_text("moving")
    assert await call(tools_client, "file_move", source=str(source), dest=str(dest)) == (
        f"Moved {source} \u2192 {dest}",
        False,
    )
    assert not source.exists() and dest.read_text() == "moving"


async def test_file_move_of_a_missing_source_is_an_error(tools_client: Client, workspace_dir: Path) -> None:
    source = workspace_dir / "ghost.txt"
    text, is_error = await call(tools_client, "file_move", source=str(source), dest=str(workspace_dir / "x.txt"))
    assert (text, is_error) == (f"Error: {source}: No such file or directory", True)
    assert not (workspace_dir / "x.txt").exists()


async def test_file_mkdir_is_recursive_and_idempotent(tools_client: Client, workspace_dir: Path) -> None:
    target = workspace_dir / "one" / "two" / "three"
    expected = (f"Created directory {target}", False)
    assert await call(tools_client, "file_mkdir", path=str(target)) == expected
    assert await call(tools_client, "file_mkdir", path=str(target)) == expected
    assert target.is_dir()


async def test_file_mkdir_over_a_file_is_an_error(tools_client: Client, workspace_dir: Path) -> None:
    (workspace_dir / "plain").write_text("x")
    text, is_error = await call(tools_client, "file_mkdir", path=str(workspace_dir / "plain"))
    assert (text, is_error) == (f"Error: {workspace_dir / 'plain'}: File exists", True)


# --- a 10 MB file, read in pages -------------------------------------------------------------------------------------

PAGE_NOTE = re.compile(
    r"\[(?:lines \d+-\d+ of \d+|file continues: lines (\d+)-\d+ \((\d+) bytes\) not shown);"
    r" call file_read with offset=(\d+) to read on\]$"
)


async def test_a_10_mb_file_is_read_in_pages_that_join_up_exactly(tools_client: Client, workspace_dir: Path) -> None:
    big = workspace_dir / "big.txt"
    lines = [f"{number:07d} {'x' * 91}\n" for number in range(1, 100_001)]  # 100 bytes a line, 10 MB
    data = "".join(lines)
    big.write_text(data)

    first = await tools_client.call_tool("file_read", {"path": str(big)})
    assert not first.is_error and len(first.model_dump_json(by_alias=True).encode()) < RESULT_CAP
    note = PAGE_NOTE.search(text_of(first))
    assert note is not None and note[1] is not None, "an unpaged read of a big file ends saying how to read on"
    pages, offset = [text_of(first)[: note.start()]], int(note[3])
    shown = sum(len(page.encode()) for page in pages)
    assert int(note[1]) == offset and int(note[2]) == len(data) - shown

    while True:
        result = await tools_client.call_tool("file_read", {"path": str(big), "offset": offset, "limit": 2000})
        text = text_of(result)
        assert not result.is_error and len(result.model_dump_json(by_alias=True).encode()) < RESULT_CAP
        assert text.startswith(lines[offset - 1]), f"the page at offset={offset} starts on that line"
        note = PAGE_NOTE.search(text)
        if note is None:
            pages.append(text)
            break
        pages.append(text[: note.start()])
        offset = int(note[3])
    assert len(pages) > 40
    assert "".join(pages) == data


# --- symlinks out of the workspace (a weakness of the earlier server) ------------------------------------------------


@pytest.fixture
def escape(workspace_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A directory outside the workspace holding secret.txt, and `link` (to it) and `secret-link` inside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    os.symlink(outside, workspace_dir / "link")
    os.symlink(outside / "secret.txt", workspace_dir / "secret-link")
    return workspace_dir, outside


async def test_file_read_through_a_symlink_out_of_the_workspace_is_refused(
    tools_client: Client, escape: tuple[Path, Path]
) -> None:
    inside, _ = escape
    for path in (inside / "link" / "secret.txt", inside / "secret-link"):
        text, is_error = await call(tools_client, "file_read", path=str(path))
        assert is_error and OUTSIDE in text and "top secret" not in text


async def test_file_write_through_a_symlink_out_of_the_workspace_is_refused(
    tools_client: Client, escape: tuple[Path, Path]
) -> None:
    inside, outside = escape
    before = snapshot(outside)
    for path in (inside / "link" / "planted.txt", inside / "link" / "secret.txt", inside / "secret-link"):
        text, is_error = await call(tools_client, "file_write", path=str(path), content="owned")
        assert is_error and OUTSIDE in text
    assert snapshot(outside) == before


async def test_file_list_through_a_symlink_out_of_the_workspace_is_refused(
    tools_client: Client, escape: tuple[Path, Path]
) -> None:
    inside, _ = escape
    for recursive in (False, True):
        text, is_error = await call(tools_client, "file_list", path=str(inside / "link"), recursive=recursive)
        assert is_error and OUTSIDE in text and "secret.txt" not in text
    text, is_error = await call(tools_client, "file_list", path=str(inside), recursive=True)
    assert not is_error and "secret.txt" not in text, "a recursive listing shows links but never enters them"


async def test_file_move_through_a_symlink_out_of_the_workspace_is_refused(
    tools_client: Client, escape: tuple[Path, Path]
) -> None:
    inside, outside = escape
    (inside / "mine.txt").write_text("mine")
    before = snapshot(outside)
    attempts = [
        (inside / "mine.txt", inside / "link" / "mine.txt"),  # into the outside directory
        (inside / "mine.txt", inside / "link"),  # "into" the linked directory
        (inside / "link" / "secret.txt", inside / "stolen.txt"),  # out of it
    ]
    for source, dest in attempts:
        text, is_error = await call(tools_client, "file_move", source=str(source), dest=str(dest))
        assert is_error and OUTSIDE in text, (source, dest, text)
    assert snapshot(outside) == before
    assert (inside / "mine.txt").read_text() == "mine" and not (inside / "stolen.txt").exists()


async def test_file_mkdir_through_a_symlink_out_of_the_workspace_is_refused(
    tools_client: Client, escape: tuple[Path, Path]
) -> None:
    inside, outside = escape
    before = snapshot(outside)
    text, is_error = await call(tools_client, "file_mkdir", path=str(inside / "link" / "made" / "here"))
    assert is_error and OUTSIDE in text
    assert snapshot(outside) == before


async def test_file_delete_of_a_symlink_removes_the_link_and_never_what_it_points_to(
    tools_client: Client, escape: tuple[Path, Path]
) -> None:
    inside, outside = escape
    text, is_error = await call(tools_client, "file_delete", path=str(inside / "link" / "secret.txt"))
    assert is_error and OUTSIDE in text
    assert await call(tools_client, "file_delete", path=str(inside / "secret-link")) == (
        f"Deleted {inside / 'secret-link'}",
        False,
    )
    assert not os.path.lexists(inside / "secret-link")
    assert (outside / "secret.txt").read_text() == "top secret\n"
