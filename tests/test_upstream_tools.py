"""The 20 tools of the reference server stay as they were: names, titles, annotations, parameters and descriptions.

tests/upstream_tools.json is tools/list as it was before the agent toolkit (issue 18) added tools beside them. The
only changes allowed are the optional parameters that issue gives them (so far `file_read`'s `line_numbers`), the
agent's `description` of a command (issue 32), sentences added after a description, and an `outputSchema` (issue 33:
the contract allows one beside the unchanged result text; tests/test_tools_typed.py checks results against it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcpserver.process import sandstorm_version
from mcpserver.services import build_services
from mcpserver.tool_server import build_server

GOLDEN = json.loads((Path(__file__).parent / "upstream_tools.json").read_text())
ADDED_PARAMETERS = {
    "file_read": {"line_numbers"},
    "terminal_exec": {"background_after", "description"},
    "terminal_exec_background": {"stdin", "pty", "description"},
}


@pytest.fixture(scope="module")
def listed() -> list[dict[str, Any]]:
    async def tools() -> list[dict[str, Any]]:
        async with Client(build_server(sandstorm_version(), build_services()), mode="legacy") as client:
            found = (await client.list_tools()).tools
        return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in found]

    return anyio.run(tools)


def test_the_twenty_come_first_in_their_order(listed: list[dict[str, Any]]) -> None:
    assert len(GOLDEN) == 20
    assert [tool["name"] for tool in listed[:20]] == [tool["name"] for tool in GOLDEN]


@pytest.mark.parametrize("golden", GOLDEN, ids=[tool["name"] for tool in GOLDEN])
def test_an_upstream_tool_is_unchanged(golden: dict[str, Any], listed: list[dict[str, Any]]) -> None:
    tool = next(tool for tool in listed if tool["name"] == golden["name"])
    assert tool["title"] == golden["title"]
    assert tool["annotations"] == golden["annotations"]
    # It may publish an outputSchema now (issue 33), an addition the contract allows: a client that reads one
    # validates each result's structured copy against it, which tests/test_tools_typed.py checks; the text is kept.
    assert tool.get("outputSchema", {"type": "object"})["type"] == "object"
    assert tool["description"].startswith(golden["description"])
    schema, was = tool["inputSchema"], golden["inputSchema"]
    assert schema.get("required", []) == was.get("required", [])
    for name, definition in was["properties"].items():
        assert schema["properties"][name] == definition, f"{golden['name']}.{name} changed"
    added = set(schema["properties"]) - set(was["properties"])
    assert added == ADDED_PARAMETERS.get(golden["name"], set())
    for name in added:
        assert "default" in schema["properties"][name], f"{golden['name']}.{name} must be optional"


def test_every_tool_added_beside_them_publishes_an_output_schema(listed: list[dict[str, Any]]) -> None:
    added = listed[20:]
    assert added, "the toolkit's tools are listed after the 20"
    for tool in added:
        assert tool.get("outputSchema", {}).get("type") == "object", f"{tool['name']} has no outputSchema"
        assert "readOnlyHint" in tool["annotations"], f"{tool['name']} is not annotated"


def test_an_agent_may_say_what_its_command_is_for_in_a_few_words(listed: list[dict[str, Any]]) -> None:
    for name in ("terminal_exec", "terminal_exec_background"):
        described = next(tool for tool in listed if tool["name"] == name)["inputSchema"]["properties"]["description"]
        assert described["default"] is None and described["anyOf"][0]["maxLength"] == 500
        assert "shown to the people who review and approve" in described["description"]
