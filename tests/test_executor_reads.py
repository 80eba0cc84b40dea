"""file_read's additions in the executor: `cat -n` line numbers within the byte budget, and images known by their
first bytes read whole (base64) up to a cap."""

from __future__ import annotations

import base64
import os
import re
import struct
from pathlib import Path

import pytest

from mcpserver.executor.environment import clean_environment
from mcpserver.executor.files import FileOps
from mcpserver.executor.images import ImageOps
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.textsize import json_size
from tests.beneath_fixtures import resolution, ws  # noqa: F401 (fixtures)
from tests.pictures import tiny_png

pytestmark = pytest.mark.anyio

BUDGET = 256 * 1024
NUMBERED = re.compile(r"^( {0,5}\d+)\t")
NOTE = re.compile(r"offset=(\d+) to read on\]$")


class Reads(FileOps, ImageOps):
    def __init__(self, root: Path) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment()


@pytest.fixture
def reads(ws: Path) -> Reads:
    return Reads(ws)


SIGNED = {
    "image/png": tiny_png(),
    "image/jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 40 + b"\xff\xd9",
    "image/gif": b"GIF89a\x01\x00\x01\x00\x80\x00\x00" + b"\x00" * 20 + b";",
    "image/webp": b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + b"\x00" * 22,
}


def numbers_of(text: str) -> list[int]:
    return [int(match.group(1)) for line in text.splitlines() if (match := NUMBERED.match(line))]


# --- line numbers ----------------------------------------------------------------------------------------------------


async def test_line_numbers_prefix_each_line_as_cat_n_does(reads: Reads, ws: Path) -> None:
    (ws / "a.txt").write_text("one\n\ttabbed\nlast")
    result = await reads.read_file("a.txt", None, None, BUDGET, line_numbers=True)
    assert result == "     1\tone\n     2\t\ttabbed\n     3\tlast"


async def test_line_numbers_are_the_files_own_with_offset_and_limit_and_the_note_is_unchanged(
    reads: Reads, ws: Path
) -> None:
    (ws / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    plain = await reads.read_file("n.txt", 7, 3, BUDGET)
    numbered = await reads.read_file("n.txt", 7, 3, BUDGET, line_numbers=True)
    assert (
        numbered
        == "     7\tline 7\n     8\tline 8\n     9\tline 9\n[lines 7-9 of 20; call file_read with offset=10 to read on]"
    )
    assert numbered.rpartition("\n")[2] == plain.rpartition("\n")[2]


async def test_line_numbers_are_right_aligned_in_six_columns_and_widen_past_them(reads: Reads, ws: Path) -> None:
    (ws / "many.txt").write_bytes(b"x\n" * 1_000_001)
    result = await reads.read_file("many.txt", 999_998, 4, BUDGET, line_numbers=True)
    assert result.splitlines() == ["999998\tx", "999999\tx", "1000000\tx", "1000001\tx"]
    (ws / "few.txt").write_text("a\n" * 12)
    assert (await reads.read_file("few.txt", 9, 2, BUDGET, line_numbers=True)).splitlines()[:2] == [
        "     9\ta",
        "    10\ta",
    ]


async def test_a_numbered_page_fits_the_budget_with_its_prefixes(reads: Reads, ws: Path) -> None:
    lines = [f"{i:05d} some text\n" for i in range(1, 20_001)]
    (ws / "big.txt").write_text("".join(lines))
    budget = 8192
    plain = await reads.read_file("big.txt", None, None, budget)
    numbered = await reads.read_file("big.txt", None, None, budget, line_numbers=True)
    assert json_size(numbered) <= budget and json_size(numbered) > budget - 1024
    shown = numbers_of(numbered)
    assert shown == list(range(1, len(shown) + 1))
    assert len(shown) < plain.count("\n") - 1  # the prefixes took room the plain page spent on lines
    assert numbered.endswith(f"call file_read with offset={len(shown) + 1} to read on]")


async def test_numbered_pages_read_on_give_the_whole_file_in_order(reads: Reads, ws: Path) -> None:
    lines = [f"{i} {'é' * (i % 50)}\n" for i in range(1, 3001)]
    (ws / "big.txt").write_text("".join(lines))
    got: list[str] = []
    offset = 1
    while True:
        result = await reads.read_file("big.txt", offset, None, 4096, line_numbers=True)
        assert json_size(result) <= 4096
        match = NOTE.search(result)
        body = result.rpartition("\n")[0] + "\n" if match else result
        for line in body.splitlines(keepends=True):
            number, _, text = line.partition("\t")
            assert int(number) == len(got) + 1  # the file's own line number, page after page
            got.append(text)
        if match is None:
            break
        offset = int(match.group(1))
        assert offset == len(got) + 1
    assert got == lines


async def test_a_numbered_line_over_the_budget_is_cut_and_the_note_counts_the_lines_bytes(
    reads: Reads, ws: Path
) -> None:
    (ws / "long.txt").write_text("short\n" + "y" * 50_000 + "\nafter\n")
    result = await reads.read_file("long.txt", 2, None, 8192, line_numbers=True)
    assert json_size(result) <= 8192
    head, cut_note, continues = result.rsplit("\n", 2)
    assert head.startswith("     2\t") and set(head[7:]) == {"y"}
    assert cut_note == f"[line 2 is 50001 bytes, over the budget: only its first {len(head) - 7} bytes are shown]"
    assert continues.startswith("[file continues: lines 3-3 (6 bytes) not shown")


async def test_line_numbers_leave_the_binary_note_as_it_was(reads: Reads, ws: Path) -> None:
    (ws / "blob").write_bytes(b"abc\x00def")
    assert await reads.read_file("blob", None, None, BUDGET, line_numbers=True) == await reads.read_file(
        "blob", None, None, BUDGET
    )


# --- images ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mime", sorted(SIGNED))
async def test_each_image_type_is_known_by_its_first_bytes(reads: Reads, ws: Path, mime: str) -> None:
    data = SIGNED[mime]
    (ws / "picture.bin").write_bytes(data)
    image = await reads.read_image("picture.bin", BUDGET)
    assert image == {
        "path": str(ws / "picture.bin"),
        "mime": mime,
        "size": len(data),
        "data": base64.b64encode(data).decode(),
    }


@pytest.mark.parametrize(
    "head",
    [b"", b"\x89PN", b"RIFF\x00\x00\x00\x00WAVEfmt ", b"GIF90a....", b"\xff\xd8\x00\x00", b"\x00\x01binary\xff"],
    ids=["empty", "short", "wave", "gif90", "not-jpeg", "binary"],
)
async def test_a_file_without_an_image_signature_is_not_an_image(reads: Reads, ws: Path, head: bytes) -> None:
    (ws / "f").write_bytes(head)
    assert await reads.read_image("f", BUDGET) is None


async def test_a_png_named_file_holding_text_is_read_as_text(reads: Reads, ws: Path) -> None:
    (ws / "notes.png").write_text("just text\n")
    assert await reads.read_image("notes.png", BUDGET) is None
    assert await reads.read_file("notes.png", None, None, BUDGET) == "just text\n"


async def test_a_txt_named_file_holding_a_png_is_an_image(reads: Reads, ws: Path) -> None:
    (ws / "notes.txt").write_bytes(tiny_png())
    image = await reads.read_image("notes.txt", BUDGET)
    assert image is not None and image["mime"] == "image/png"
    assert base64.b64decode(image["data"]) == tiny_png()


async def test_an_image_over_the_cap_comes_without_data_and_says_its_size(reads: Reads, ws: Path) -> None:
    data = tiny_png() + b"\x00" * 5000
    (ws / "big.png").write_bytes(data)
    assert await reads.read_image("big.png", len(data) - 1) == {
        "path": str(ws / "big.png"),
        "mime": "image/png",
        "size": len(data),
        "data": None,
    }
    image = await reads.read_image("big.png", len(data))
    assert image is not None and base64.b64decode(image["data"]) == data


async def test_reading_an_image_fails_like_a_read_for_a_missing_file_a_directory_or_a_fifo(
    reads: Reads, ws: Path
) -> None:
    (ws / "d").mkdir()
    os.mkfifo(ws / "pipe")
    for path in ("missing.png", "d", "pipe"):
        with pytest.raises(ToolFailure) as image_failure:
            await reads.read_image(path, BUDGET)
        with pytest.raises(ToolFailure) as read_failure:
            await reads.read_file(path, None, None, BUDGET)
        assert str(image_failure.value) == str(read_failure.value)
    assert str(image_failure.value) == f"Error: {ws / 'pipe'}: Not a regular file"


async def test_an_image_through_a_symlink_out_of_the_workspace_is_refused(
    reads: Reads, ws: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.png").write_bytes(tiny_png())
    (ws / "inside.png").symlink_to(tmp_path / "secret.png")
    for path in ("inside.png", "../secret.png", str(tmp_path / "secret.png")):
        with pytest.raises(ToolFailure, match="is outside the allowed directory"):
            await reads.read_image(path, BUDGET)


async def test_an_image_through_a_symlink_inside_the_workspace_names_its_real_path(reads: Reads, ws: Path) -> None:
    (ws / "real.gif").write_bytes(SIGNED["image/gif"])
    (ws / "link.txt").symlink_to(ws / "real.gif")
    image = await reads.read_image("link.txt", BUDGET)
    assert image is not None and image["path"] == str(ws / "real.gif") and image["mime"] == "image/gif"
