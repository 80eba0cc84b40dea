"""Typed tool results (issue 33), through the in-process /mcp application in both protocol eras: every tool publishes
an outputSchema or is named below as text only, with why; each typed tool's results carry structuredContent that its
schema accepts (checked with jsonschema, as a client's validator checks it), beside the text they always had."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import jsonschema  # type: ignore[import-untyped]  # no stubs; the mcp SDK requires it (its client validates with it)
import pytest

from tests.inprocess import InProcessServer, new_token, text_of
from tests.live import INITIALIZE

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

SESSION_VERSION = "2025-11-25"
REQUEST_IDS = itertools.count(2)
DEADLINE = 30.0  # seconds a background command may take to end on a loaded machine

# A client such as Claude Code shows the model the structured copy in place of the text when there is one, so a
# copy must say what the text says; for these tools it could only repeat a document that fills the result.
DOCUMENT = (
    "its result is a document ({what}): a structured copy could only repeat it, halving what one result holds, "
    "or leave it out and hide it from clients that show the model the structured copy instead of the text"
)
GIT_OUTPUT = DOCUMENT.format(what="git's own output, and notes on what was skipped")
TEXT_ONLY = {
    "file_read": DOCUMENT.format(what="the file's content, paged to fill the result"),
    "file_list": DOCUMENT.format(what="`ls -la`'s listing, or a tree"),
    "git_clone": GIT_OUTPUT,
    "git_status": GIT_OUTPUT,
    "git_commit": GIT_OUTPUT,
    "git_push": GIT_OUTPUT,
    "git_pull": GIT_OUTPUT,
    "git_branch": GIT_OUTPUT,
    "git_checkout": GIT_OUTPUT,
    "git_diff": GIT_OUTPUT,
}

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def open_session(server: InProcessServer, token: str) -> dict[str, str]:
    """A 2025-11-25 session opened by the handshake: the headers its requests carry."""
    async with server.http(token) as http:
        opened = await http.post("/mcp", json=INITIALIZE)
        assert opened.status_code == 200, opened.text
        headers = {"mcp_session_id": opened.headers["mcp-session-id"], "mcp_protocol_version": SESSION_VERSION}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await server.post(token, initialized, **headers)).status_code == 202
    return headers


async def in_session(server: InProcessServer, token: str, headers: dict[str, str], method: str, params: Any) -> Any:
    """The result of one request in a 2025-11-25 session (answered as JSON: it asks for no progress)."""
    message = {"jsonrpc": "2.0", "id": next(REQUEST_IDS), "method": method, "params": params}
    response = await server.post(token, message, **headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert "result" in body, body
    return body["result"]


async def schemas_in_both_eras(server: InProcessServer, token: str) -> list[dict[str, Any]]:
    """tools/list's name and outputSchema of every tool, after checking that both eras list the same."""
    async with server.client(token) as client:  # 2026-07-28
        listed = [tool.model_dump(mode="json", by_alias=True) for tool in (await client.list_tools()).tools]
    session = await open_session(server, token)
    in_session_era = (await in_session(server, token, session, "tools/list", {}))["tools"]
    schemas = [{"name": tool["name"], "outputSchema": tool.get("outputSchema")} for tool in listed]
    assert [{"name": tool["name"], "outputSchema": tool.get("outputSchema")} for tool in in_session_era] == schemas
    return schemas


async def test_every_tool_publishes_an_output_schema_or_is_named_text_only_with_why(
    mcp_app: InProcessServer,
) -> None:
    schemas = await schemas_in_both_eras(mcp_app, await new_token("typed-list"))
    for tool in schemas:
        if tool["name"] in TEXT_ONLY:
            assert tool["outputSchema"] is None, f"{tool['name']} is typed now: take it off TEXT_ONLY"
        else:
            assert tool["outputSchema"] is not None, f"{tool['name']} has no outputSchema and is not named text-only"
            assert tool["outputSchema"]["type"] == "object"
            jsonschema.validators.validator_for(tool["outputSchema"]).check_schema(tool["outputSchema"])
    assert set(TEXT_ONLY) <= {tool["name"] for tool in schemas}, "TEXT_ONLY names a tool that is not listed"


class TypedCalls:
    """Calls in one era, each typed result's structuredContent validated against its tool's outputSchema."""

    def __init__(self, call: Call, schemas: dict[str, dict[str, Any] | None]) -> None:
        self._call = call
        self.schemas = schemas
        self.validated: set[str] = set()

    async def __call__(self, name: str, arguments: dict[str, Any], error: bool | None = False) -> dict[str, Any]:
        """`error`: whether the call must fail (None: it may, as the host decides)."""
        result = await self._call(name, arguments)
        assert error is None or bool(result.get("isError")) == error, (name, text_of(result))
        error = bool(result.get("isError"))
        schema, structured = self.schemas[name], result.get("structuredContent")
        assert schema is not None, f"{name} is not typed"
        if not error:
            assert structured is not None, f"{name} answered without structuredContent"
        if structured is not None:  # an error result may carry one too (terminal_exec's non-zero exit)
            jsonschema.validate(structured, schema)
            self.validated.add(name)
        return result


async def exercise_every_typed_tool(call: TypedCalls, workspace: Path) -> None:
    root = workspace.resolve()
    await file_tools(call, root)
    await command_tools(call, root)
    await background_tools(call)
    typed = {name for name, schema in call.schemas.items() if schema is not None}
    assert call.validated == typed, f"typed tools this test does not call: {sorted(typed - call.validated)}"


async def file_tools(call: TypedCalls, root: Path) -> None:
    written = await call("file_write", {"path": "typed/a.txt", "content": "héllo\n"})
    assert text_of(written) == f"Written 6 bytes to {root / 'typed/a.txt'}"  # the reference text: characters
    assert written["structuredContent"] == {"path": str(root / "typed/a.txt"), "bytes": 7}
    made = await call("file_mkdir", {"path": "typed/sub"})
    assert made["structuredContent"] == {"path": str(root / "typed/sub")}
    moved = await call("file_move", {"source": "typed/a.txt", "dest": "typed/sub"})
    assert text_of(moved) == f"Moved {root / 'typed/a.txt'} \u2192 {root / 'typed/sub/a.txt'}"
    assert moved["structuredContent"] == {"source": str(root / "typed/a.txt"), "dest": str(root / "typed/sub/a.txt")}
    await call("file_edit", {"path": "typed/sub/a.txt", "old_string": "héllo", "new_string": "hello"})
    await call("file_multi_edit", {"path": "typed/sub/a.txt", "edits": [{"old_string": "hello", "new_string": "hi"}]})
    await call("file_grep", {"pattern": "hi", "path": "typed", "output_mode": "content"})
    await call("file_glob", {"pattern": "**/*.txt", "path": "typed"})
    await call("apply_patch", {"input": "*** Begin Patch\n*** Add File: typed/p.txt\n+p\n*** End Patch"})
    deleted = await call("file_delete", {"path": "typed/sub/a.txt"})
    assert deleted["structuredContent"] == {"path": str(root / "typed/sub/a.txt")}


async def command_tools(call: TypedCalls, root: Path) -> None:
    ran = await call("terminal_exec", {"command": "echo out; echo err >&2"})
    assert text_of(ran) == "stdout:\nout\n\nstderr:\nerr\n\nexit_code: 0"
    assert (ran["structuredContent"]["stdout"], ran["structuredContent"]["stderr"]) == ("out\n", "err\n")
    await call("terminal_exec", {"command": "exit 3"}, error=True)
    identity = "-c user.name=t -c user.email=t@example.com -c commit.gpgsign=false"
    commit = f"git init -q repo && git -C repo {identity} commit -q --allow-empty -m"
    await call("terminal_exec", {"command": f"{commit} 'first commit'"})
    logged = await call("git_log", {"path": "repo"})
    [first] = logged["structuredContent"]["commits"]
    assert text_of(logged) == f"{first['hash']} first commit" and first["subject"] == "first commit"
    info = await call("workspace_info", {})
    sections = info["structuredContent"]
    assert sections["cwd"] == str(root)
    for title in ("OS", "Node", "Git", "Disk", "CWD", "Tools", "Memory"):  # each section whole, as the text has it
        assert f"=== {title} ===\n{sections[title.lower()]}\n" in text_of(info)
    # What pip does depends on the host (finds pip installed, or refuses an "externally managed" python3): its
    # structured copy is validated either way.
    await call("workspace_install", {"packages": "pip", "manager": "pip"}, error=None)


async def background_tools(call: TypedCalls) -> None:
    started = await call("terminal_exec_background", {"command": "cat", "stdin": True})
    pid, log = started["structuredContent"]["pid"], started["structuredContent"]["output_path"]
    assert text_of(started) == f"PID: {pid}\nStarted background process {pid}\nOutput: {log}"
    await call("terminal_input", {"id": pid, "text": "typed\n", "eof": True})
    with anyio.fail_after(DEADLINE):
        while (await call("terminal_output", {"id": pid, "wait_ms": 5_000}))["structuredContent"]["state"] == "running":
            pass
    await call("terminal_list", {})
    carried = await call("terminal_exec", {"command": "sleep 30", "background_after": 0.2})
    assert carried["structuredContent"]["background"] is True and carried["structuredContent"]["exit_code"] is None
    killed = await call("terminal_kill", {"pid": carried["structuredContent"]["id"]})
    assert killed["structuredContent"] == {"pid": carried["structuredContent"]["id"], "signal": "SIGTERM"}
    quick = await call("terminal_exec", {"command": "echo quick", "background_after": 10})
    assert (quick["structuredContent"]["output"], quick["structuredContent"]["background"]) == ("quick\n", False)


@pytest.mark.parametrize("era", ["2026-07-28", SESSION_VERSION])
async def test_each_typed_tool_answers_with_structured_content_its_schema_accepts_beside_its_text(
    mcp_app: InProcessServer, era: str
) -> None:
    token = await new_token(f"typed-{era}")
    schemas = {tool["name"]: tool["outputSchema"] for tool in await schemas_in_both_eras(mcp_app, token)}
    if era == SESSION_VERSION:
        session = await open_session(mcp_app, token)

        async def in_this_session(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            params = {"name": name, "arguments": arguments}
            return dict(await in_session(mcp_app, token, session, "tools/call", params))

        await exercise_every_typed_tool(TypedCalls(in_this_session, schemas), mcp_app.workspace)
        return
    async with mcp_app.client(token) as client:

        async def through_the_sdk(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = await client.call_tool(name, arguments)  # the SDK client checks the copy against the schema too
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        await exercise_every_typed_tool(TypedCalls(through_the_sdk, schemas), mcp_app.workspace)
