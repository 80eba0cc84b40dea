"""file_read, file_write, file_delete, file_list, file_move, file_mkdir."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.executor.paging import check_page_args
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, Image, ToolOutput, ToolResult

PathArg = Annotated[str, Field(description="Absolute, or relative to the workspace root; must stay inside it.")]


IMAGE_MAX_BYTES = 5 * 1024 * 1024
MOVED = " \u2192 "  # between the two paths of file_move's text


class WriteResult(ToolOutput):
    path: str = Field(description="The real path written (symlinks resolved).")
    bytes: int = Field(description="Bytes written: the content's UTF-8 size.")


class DeleteResult(ToolOutput):
    path: str = Field(description="The real path deleted; a file that was not there counts as deleted.")


class MoveResult(ToolOutput):
    source: str = Field(description="The real path moved.")
    dest: str = Field(description="Where it is now (inside dest when dest was a directory).")


class MkdirResult(ToolOutput):
    path: str = Field(description="The real path of the directory, which exists now.")


def path_in(text: str, prefix: str) -> str:
    """The path a result text gives after `prefix` (the reference server's texts are fixed, so facts are read there)."""
    if not text.startswith(prefix):
        raise ValueError(f"unexpected result text {text[:200]!r}")
    return text[len(prefix) :]


def image_cap(result_cap: int) -> int:
    """The largest image (raw bytes) file_read returns inline: its base64 (4 characters per 3 bytes, rounded up)
    must fit the room render() keeps for an image, with an envelope's room left for the line describing it."""
    return min((result_cap - 3 * ENVELOPE_BYTES) // 4 * 3, IMAGE_MAX_BYTES)


def image_result(image: dict[str, Any], cap: int) -> ToolResult:
    described = f"Image {image['path']} ({image['mime']}, {image['size']} bytes)"
    if image["data"] is None:
        return ToolResult(
            f"{described} is too large to return inline: the cap is {cap} bytes. Make a smaller copy first, e.g. "
            "with terminal_exec running `convert IN -resize 1024x1024 -quality 85 OUT.jpg` (ImageMagick), "
            "`ffmpeg -i IN -vf scale=1024:-1 OUT.png`, `pngquant` or `cwebp`, and read that."
        )
    return ToolResult(described, images=[Image(image["data"], image["mime"])])


@tool(title="Read a file", read_only=True, idempotent=True)
async def file_read(
    call: ToolCall,
    path: PathArg,
    offset: Annotated[int | None, Field(description="First line to return (1-based).")] = None,
    limit: Annotated[int | None, Field(description="Number of lines to return.")] = None,
    line_numbers: Annotated[
        bool, Field(description="Prefix each line with its number in the file, as `cat -n` does.")
    ] = False,
) -> ToolResult:
    """Read a text file from the workspace. Large files are returned in pages: use offset and limit to read on.
    A PNG, JPEG, GIF or WebP file (known by its first bytes, not its name) comes back as image content instead;
    offset, limit and line_numbers do not apply to it."""
    check_page_args(offset, limit)  # first, so a bad offset fails as it always did, image or not
    cap = image_cap(call.result_cap)
    budget = call.result_cap - 2 * ENVELOPE_BYTES
    found = await call.executor.read_file_or_image(path, offset, limit, budget, line_numbers, cap)
    if "image" in found:
        return image_result(found["image"], cap)
    return ToolResult(found["text"])


@tool(title="Write a file", destructive=True, idempotent=True, output=WriteResult)
async def file_write(call: ToolCall, path: PathArg, content: str) -> ToolResult:
    """Write text to a file in the workspace, replacing it if it exists; parent folders are created."""
    text = await call.executor.write_file(path, content)
    real = path_in(text, f"Written {len(content)} bytes to ")  # the reference text counts characters
    return ToolResult(text, structured={"path": real, "bytes": len(content.encode("utf-8"))})


@tool(title="Delete a file", destructive=True, idempotent=True, output=DeleteResult)
async def file_delete(call: ToolCall, path: PathArg) -> ToolResult:
    """Delete a file (not a directory) in the workspace. A missing file is not an error."""
    text = await call.executor.delete_file(path)
    return ToolResult(text, structured={"path": path_in(text, "Deleted ")})


@tool(title="List a directory", read_only=True, idempotent=True)
async def file_list(
    call: ToolCall,
    path: Annotated[str, Field(description="Directory to list; empty means the workspace root.")] = "",
    recursive: Annotated[bool, Field(description="List the tree (5 levels, 500 lines at most).")] = False,
) -> ToolResult:
    """List a directory like `ls -la`, or its tree (one path a line) when recursive."""
    return ToolResult(await call.executor.list_dir(path, recursive))


@tool(title="Move or rename", destructive=True, output=MoveResult)
async def file_move(call: ToolCall, source: PathArg, dest: PathArg) -> ToolResult:
    """Move or rename a file or directory inside the workspace; the destination's parent is created."""
    text = await call.executor.move(source, dest)
    moved, _, to = path_in(text, "Moved ").partition(MOVED)  # a source path holding " → " itself would split there
    return ToolResult(text, structured={"source": moved, "dest": to})


@tool(title="Create a directory", idempotent=True, output=MkdirResult)
async def file_mkdir(call: ToolCall, path: PathArg) -> ToolResult:
    """Create a directory and its parents; no error if it exists."""
    text = await call.executor.mkdir(path)
    return ToolResult(text, structured={"path": path_in(text, "Created directory ")})
