"""file_edit and file_multi_edit: exact string replacement in a workspace file, answered with the unified diff."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from pydantic import Field
from typing_extensions import TypedDict

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ENVELOPE_BYTES, ToolOutput, ToolResult
from mcpserver.tools.files import PathArg

OldString = Annotated[str, Field(description="The exact text to replace (whitespace and line breaks included).")]
NewString = Annotated[str, Field(description="The text to put in its place.")]
ReplaceAll = Annotated[bool, Field(description="Replace every occurrence; otherwise old_string must occur once.")]
# The structured copy and its JSON escaping take room beside the diff; the rest of the result cap is the diff's.
STRUCTURED_ROOM = 2 * ENVELOPE_BYTES


class EditResult(ToolOutput):
    path: str = Field(description="The real path of the file edited.")
    replacements: int = Field(description="How many occurrences were replaced.")
    diff_truncated: bool = Field(description="Whether the diff in the text was cut to fit the result.")


class MultiEditResult(EditResult):
    edits: int = Field(description="How many edits were applied.")


class EditItem(TypedDict):
    old_string: str
    new_string: str
    replace_all: NotRequired[bool]


@tool(title="Edit a file", output=EditResult)
async def file_edit(
    call: ToolCall, path: PathArg, old_string: OldString, new_string: NewString, replace_all: ReplaceAll = False
) -> ToolResult:
    """Replace an exact string in a text file of the workspace and show the change as a unified diff.

    old_string must occur exactly once unless replace_all; when it is not found, the error shows the closest
    region of the file and how it differs (indentation, trailing whitespace, line endings, case).
    """
    edit = {"old_string": old_string, "new_string": new_string, "replace_all": replace_all}
    done = await call.executor.edit_file(path, [edit], _budget(call))
    return ToolResult(done["diff"], structured=_structured(done))


@tool(title="Edit a file in several places", output=MultiEditResult)
async def file_multi_edit(
    call: ToolCall,
    path: PathArg,
    edits: Annotated[
        list[EditItem],
        Field(description="Edits applied in order, each to the result of the one before; all or none.", min_length=1),
    ],
) -> ToolResult:
    """Apply several exact string replacements to one text file, all or nothing, and show one unified diff.

    If any edit fails (not found, or not unique without replace_all), the error names it and the file is unchanged.
    """
    done = await call.executor.edit_file(path, [dict(edit) for edit in edits], _budget(call))
    return ToolResult(done["diff"], structured={**_structured(done), "edits": len(edits)})


def _budget(call: ToolCall) -> int:
    return call.result_cap - 2 * ENVELOPE_BYTES - STRUCTURED_ROOM


def _structured(done: dict[str, Any]) -> dict[str, Any]:
    return {key: done[key] for key in ("path", "replacements", "diff_truncated")}
