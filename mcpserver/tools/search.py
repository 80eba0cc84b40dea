"""file_grep and file_glob: content search (ripgrep) and path globs in the workspace, paged."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, ToolOutput, ToolResult

SearchPath = Annotated[
    str | None, Field(description="Directory to search, absolute or relative to the workspace root; default the root.")
]
# The structured copy and the closing note take room beside the listed entries.
NOTE_ROOM = 2 * ENVELOPE_BYTES


class GrepResult(ToolOutput):
    mode: str = Field(description="The output_mode answered.")
    total: int = Field(description="Entries found: lines (content), files, or files with a count.")
    shown: int = Field(description="Entries in this result.")
    offset: int = Field(description="The first entry shown (0-based).")
    next_offset: int | None = Field(description="The offset to read on from; null when nothing is left.")
    matches: int | None = Field(default=None, description="count mode: matches in all files.")
    output_cut: bool = Field(description="The search printed more than the server keeps: narrow it.")


class GlobResult(ToolOutput):
    count: int = Field(description="Files matching.")
    shown: int = Field(description="Files listed in this result (newest first).")
    more: int = Field(description="Files matching but not listed.")


def _budget(call: ToolCall) -> int:
    return call.result_cap - NOTE_ROOM - 2 * ENVELOPE_BYTES


@tool(title="Search file contents", read_only=True, idempotent=True, output=GrepResult)
async def file_grep(
    call: ToolCall,
    pattern: Annotated[str, Field(description="A regular expression (ripgrep's syntax).")],
    path: SearchPath = None,
    glob: Annotated[
        str | None, Field(description='Only files matching this glob, e.g. "*.py" or "src/**/*.ts".')
    ] = None,
    type: Annotated[str | None, Field(description="Only files of this ripgrep type, e.g. py, js, rust.")] = None,
    output_mode: Annotated[
        Literal["content", "files_with_matches", "count"],
        Field(description="Matching lines, the files that match (newest first), or a count per file."),
    ] = "files_with_matches",
    case_insensitive: bool = False,
    line_numbers: Annotated[bool, Field(description="content mode: show line numbers.")] = True,
    context_before: Annotated[int | None, Field(description="content mode: lines before each match.")] = None,
    context_after: Annotated[int | None, Field(description="content mode: lines after each match.")] = None,
    multiline: Annotated[bool, Field(description="Let the pattern span lines (`.` matches newlines).")] = False,
    head_limit: Annotated[int | None, Field(description="At most this many entries (default 250).")] = None,
    offset: Annotated[int, Field(description="Skip this many entries (to read on).")] = 0,
) -> ToolResult:
    """Search file contents with ripgrep. `.gitignore` is respected, hidden files are searched (not .git), and
    symlinks are not followed. Paths are relative to `path`. Results are paged: head_limit and offset."""
    found = await call.executor.grep(
        pattern, path, glob, type, output_mode, case_insensitive, line_numbers,
        context_before, context_after, multiline, head_limit, offset, _budget(call),
    )  # fmt: skip
    entries: list[str] = found["entries"]
    structured = {
        "mode": output_mode,
        "total": found["total"],
        "shown": len(entries),
        "offset": found["offset"],
        "next_offset": found["next_offset"],
        "matches": found.get("matches"),
        "output_cut": found["output_cut"],
    }
    return ToolResult(_grep_text(found, output_mode), structured=structured)


def _grep_text(found: dict[str, Any], mode: str) -> str:
    entries: list[str] = found["entries"]
    if not found["total"]:
        return "No matches found"
    lines = list(entries)
    if mode == "count":
        files = "file" if found["total"] == 1 else "files"
        lines.append(f"\nFound {found['matches']} matches in {found['total']} {files}")
    if found["next_offset"] is not None:
        first = found["offset"] + 1
        lines.append(
            f"\n[entries {first}-{found['offset'] + len(entries)} of {found['total']}; "
            f"call file_grep with offset={found['next_offset']} for more]"
        )
    elif not entries:
        lines.append(f"[no entries from offset {found['offset']}: there are {found['total']}]")
    if found["output_cut"]:
        lines.append("[the search printed more than the server keeps: narrow it with path, glob or type]")
    return "\n".join(lines)


@tool(title="Find files by name", read_only=True, idempotent=True, output=GlobResult)
async def file_glob(
    call: ToolCall,
    pattern: Annotated[str, Field(description='A glob such as "**/*.py" or "src/*.{ts,tsx}".')],
    path: SearchPath = None,
) -> ToolResult:
    """Files whose path (relative to `path`) matches a glob, newest first; at most 100 are listed.
    `.gitignore` is respected and symlinks are not followed."""
    found = await call.executor.glob_files(pattern, path, _budget(call))
    files: list[str] = found["entries"]
    more = found["total"] - len(files)
    text = "\n".join(files) if files else "No files found"
    if more:
        text += f"\n... and {more} more (narrow the pattern or path)"
    return ToolResult(text, structured={"count": found["total"], "shown": len(files), "more": more})
