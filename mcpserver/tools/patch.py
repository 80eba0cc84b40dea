"""apply_patch: a patch in the format OpenAI's Codex models write, applied to the workspace all or nothing, answered
with a line per file and the unified diff (the executor's patch.py reads it, patching.py writes it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, ToolOutput, ToolResult

# Codex's name for it: models trained on Codex call apply_patch with `input`.
PatchText = Annotated[
    str, Field(description="The whole patch, from '*** Begin Patch' to '*** End Patch', as the description shows.")
]
# The structured copy's facts and JSON escaping take room beside the text (the executor leaves the files' list room).
STRUCTURED_ROOM = 2 * ENVELOPE_BYTES


class PatchedFile(ToolOutput):
    action: Literal["added", "updated", "moved", "deleted"] = Field(description="What the patch did to the file.")
    path: str = Field(description="The file's real path (for a move, where it went).")
    moved_from: str | None = Field(default=None, description="For a move: the real path it had.")
    added_lines: int = Field(description="Lines added.")
    removed_lines: int = Field(description="Lines removed.")


class PatchResult(ToolOutput):
    files: list[PatchedFile] = Field(description="One entry per operation of the patch, in its order.")
    added_lines: int = Field(description="Lines added in all.")
    removed_lines: int = Field(description="Lines removed in all.")
    diff: str = Field(description="A line per file and the unified diff of the whole change, as the text has them.")
    diff_truncated: bool = Field(description="Whether the diff was cut to fit the result.")


@tool(title="Apply a patch", destructive=True, output=PatchResult)
async def apply_patch(call: ToolCall, input: PatchText) -> ToolResult:
    """Apply a patch to files of the workspace: add, delete, update and move several files in one call, all or
    nothing. The format is the one OpenAI's Codex models write:

    *** Begin Patch
    *** Add File: docs/hello.txt
    +Every line of a new file starts with +.
    *** Update File: src/app.py
    *** Move to: src/main.py
    @@ def greet():
     context line, as in the file, after a space
    -a line removed
    +a line added
    *** Delete File: old/notes.txt
    *** End Patch

    Paths are relative to the workspace root (or absolute inside it). `*** Move to:` (optional, right after Update
    File) renames the file too. `@@ <line>` (optional) names a line of the file the hunk comes after, such as the
    class or function it is in; several `@@` lines in a row narrow it down. Give about 3 lines of context before and
    after each change; `*** End of File` after a hunk's lines says they end the file. Context is matched exactly,
    then ignoring whitespace at the line ends. If any hunk does not apply, no file is changed and the error shows
    the closest region of the file and how it differs.
    """
    # The diff travels twice (text and structured copy, which clients such as Codex show their model instead of the
    # text), so each copy gets under half.
    done = await call.executor.apply_patch(input, (call.result_cap - 2 * ENVELOPE_BYTES - STRUCTURED_ROOM) // 2)
    files = done["files"]
    structured = {
        "files": files,
        "added_lines": sum(entry["added_lines"] for entry in files),
        "removed_lines": sum(entry["removed_lines"] for entry in files),
        "diff": done["text"],
        "diff_truncated": done["diff_truncated"],
    }
    return ToolResult(done["text"], structured=structured)
