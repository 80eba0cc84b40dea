"""The console's live view in headless Chromium against a real server, with real calls from the official SDK client:
an approval card appears on the page an admin has open within a second of the request, and its buttons decide it;
the Live page streams a running command's output, its Stop button ends the call, and its "Revoke credential" asks
first, then comes back to Live saying what was revoked."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from playwright.sync_api import Browser, Page, WebSocket

from tests.browser import log_in_as_admin, wait_until
from tests.live import LiveServer, mcp_client, running_server, text_of

pytestmark = [pytest.mark.live, pytest.mark.browser]
DEADLINE = 15.0
POLICY = {"rules": [{"id": "console-asks", "decision": "ask", "commands": ["printf"], "description": "printing"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of this module's own whose policy asks about `printf`, holding such a call for a minute."""
    root = tmp_path_factory.mktemp("live-view")
    with running_server(root, SANDSTORM_APPROVAL_HOLD="60", SANDSTORM_APPROVAL_TIMEOUT="120") as live:
        policy = root / "policy.json"
        policy.write_text(json.dumps(POLICY))
        live.manage("policy_load", str(policy))
        yield live


@pytest.fixture(scope="module")
def calls() -> Iterator[ThreadPoolExecutor]:
    """Calls run in threads of their own: Playwright's sync API runs an event loop in the test's thread."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool


@pytest.fixture
def page(browser: Browser, server: LiveServer) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    log_in_as_admin(page, server)
    yield page
    context.close()


def call_in_thread(
    pool: ThreadPoolExecutor, server: LiveServer, tool: str, arguments: dict[str, Any], token: str | None = None
) -> Future[CallToolResult | BaseException]:
    async def call() -> CallToolResult | BaseException:
        async with mcp_client(server.mcp_url, token or server.token) as client:
            try:
                return await client.call_tool(tool, arguments)
            except MCPError as error:  # a stopped call may end in an error the client raises: the test reads it
                return error

    return pool.submit(anyio.run, call)


def socket_frames(page: Page) -> list[dict[str, Any]]:
    """The messages the page's live socket receives from now on."""
    frames: list[dict[str, Any]] = []

    def watch(socket: WebSocket) -> None:
        socket.on("framereceived", lambda payload: frames.append(json.loads(payload)))

    page.on("websocket", watch)
    return frames


def open_with_snapshot(page: Page, url: str) -> list[dict[str, Any]]:
    frames = socket_frames(page)
    page.goto(url)
    wait_until(page, lambda: any(frame.get("type") == "snapshot" for frame in frames), what="the socket's snapshot")
    return frames


def created_at(server: LiveServer, marker: str) -> datetime:
    rows = server.database.query(
        "SELECT created_at FROM mcpserver_approvalrequest WHERE CAST(arguments AS TEXT) LIKE %s ORDER BY id DESC",
        f"%{marker}%",
    )
    value = rows[0]["created_at"]
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def audit_events(server: LiveServer, name: str) -> list[dict[str, Any]]:
    rows = server.database.query("SELECT username, detail FROM audit_auditrecord WHERE event = %s ORDER BY id", name)
    return [
        {
            "username": row["username"],
            **(json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]),
        }
        for row in rows
    ]


def result_of(future: Future[CallToolResult | BaseException]) -> Callable[[], CallToolResult | BaseException | None]:
    return lambda: future.result() if future.done() else None


def test_a_card_appears_within_a_second_and_approving_runs_the_call(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    open_with_snapshot(page, f"{server.url}/admin/")
    marker = uuid.uuid4().hex
    future = call_in_thread(calls, server, "terminal_exec", {"command": f"printf '%s' {marker}", "cwd": "."})
    card = page.locator(".approval-card", has_text=marker)
    card.wait_for(timeout=DEADLINE * 1000)
    seen = datetime.now(UTC)
    assert (seen - created_at(server, marker)).total_seconds() < 1.0

    assert card.locator(".approval-command").inner_text() == f"printf '%s' {marker}"
    assert "console-asks" in card.locator(".approval-rule").inner_text()
    assert card.locator(".approval-minutes").input_value() == "10"
    assert page.locator("#nav-live .live-count").inner_text() == "1"
    card.get_by_role("button", name="Approve once").click()
    result = wait_until(page, result_of(future), what="the approved call's result")
    assert isinstance(result, CallToolResult) and not result.is_error and marker in text_of(result)
    said = card.locator(".approval-said")
    wait_until(page, lambda: "approved by admin (console)" in said.inner_text(), what="the card saying who decided")
    decided = audit_events(server, "approval.decided")[-1]
    assert (decided["username"], decided["decision"], decided["channel"]) == ("admin", "approved", "console")


def test_denying_from_the_live_page_gives_the_agent_the_reason(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    open_with_snapshot(page, f"{server.url}/admin/live/")
    marker = uuid.uuid4().hex
    future = call_in_thread(calls, server, "terminal_exec", {"command": f"printf {marker}"})
    card = page.locator("#live-approvals-cards .approval-card", has_text=marker)
    card.wait_for(timeout=DEADLINE * 1000)
    assert (
        page.locator("#live-calls .live-call", has_text=marker)
        .locator(".live-call-state")
        .inner_text()
        .startswith("awaiting approval R-")
    )
    card.locator(".approval-reason").fill("not on a Friday")
    card.get_by_role("button", name="Deny").click()
    result = wait_until(page, result_of(future), what="the denied call's result")
    assert isinstance(result, CallToolResult) and result.is_error and "not on a Friday" in text_of(result)
    wait_until(page, lambda: card.count() == 0, what="the decided card to go")  # after saying who decided


def test_the_live_page_streams_a_commands_output_and_stops_it(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    frames = open_with_snapshot(page, f"{server.url}/admin/live/")
    marker = uuid.uuid4().hex[:12]
    command = f": {marker}; for i in $(seq 100); do echo line $i; sleep 0.1; done"
    began = time.monotonic()
    future = call_in_thread(calls, server, "terminal_exec", {"command": command})
    row = page.locator("#live-calls .live-call", has_text=marker)
    output = row.locator(".live-call-output")
    wait_until(page, lambda: "line 5\n" in output.inner_text(), what="the command's output on the page")
    assert "line 1\nline 2\nline 3\n" in output.inner_text()
    assert sum(1 for frame in frames if frame.get("type") == "batch") > 1  # streamed, not at the end
    assert row.locator(".live-call-elapsed").inner_text().startswith("0:0")

    row.get_by_role("button", name="Stop").click()
    wait_until(page, result_of(future), what="the stopped call to end")
    assert time.monotonic() - began < 9  # the command alone takes 10 s
    wait_until(page, lambda: row.locator(".live-call-state").inner_text().startswith("ended"), what="the row ended")
    assert "line 100" not in output.inner_text()
    stopped = audit_events(server, "console.call_stopped")[-1]
    assert stopped["username"] == "admin" and stopped["tool"] == "terminal_exec" and marker in stopped["summary"]
    # The call's own page says who stopped it and through which channel.
    call_page = page.context.new_page()
    call_page.goto(f"{server.url}/admin/audit/auditrecord/?q={marker}")
    call_page.locator("#result_list tbody tr a").first.click()
    wait_until(call_page, lambda: call_page.locator("#call-outcome").count(), what="the call page")
    assert "stopped by admin from the console's Live view" in call_page.locator("#call-outcome").inner_text()
    call_page.close()


def test_the_live_page_shows_every_byte_up_to_the_exit_and_still_after_a_reload(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    """The end of a command's output came with its end and was lost; so was everything once the page reloaded."""
    open_with_snapshot(page, f"{server.url}/admin/live/")
    marker = uuid.uuid4().hex[:12]
    command = f"echo {marker} a; sleep 0.6; echo b; sleep 0.6; echo c; sleep 0.3; echo d; echo final-stderr >&2"
    future = call_in_thread(calls, server, "terminal_exec", {"command": command})
    row = page.locator("#live-calls .live-call", has_text=marker)
    output = row.locator(".live-call-output")
    result = wait_until(page, result_of(future), what="the call's result")
    assert isinstance(result, CallToolResult) and not result.is_error
    wait_until(page, lambda: row.locator(".live-call-state").inner_text() == "ended: ok", what="the row ended")
    expected = f"{marker} a\nb\nc\nd\nfinal-stderr\n"
    assert output.inner_text() == expected
    assert row.locator(".live-call-elapsed").inner_text() == "0:01"  # how long it ran (1.5 s), not the last tick

    open_with_snapshot(page, f"{server.url}/admin/live/")  # a reload: the call is over
    wait_until(page, lambda: output.count() == 1 and output.inner_text() == expected, what="the ended call again")
    assert row.locator(".live-call-state").inner_text() == "ended: ok"


def test_the_agents_description_is_on_its_card_and_its_live_row_as_its_words(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    open_with_snapshot(page, f"{server.url}/admin/live/")
    marker = uuid.uuid4().hex
    said = f"prints a marker <b>{marker[:6]}</b>"
    future = call_in_thread(calls, server, "terminal_exec", {"command": f"printf {marker}", "description": said})
    card = page.locator("#live-approvals-cards .approval-card", has_text=marker)
    card.wait_for(timeout=DEADLINE * 1000)
    described = card.locator(".approval-description")
    assert described.locator(".agent-says-label").inner_text().strip() == "The agent says:"
    assert described.locator(".agent-says-words").inner_text() == said
    row = page.locator("#live-calls .live-call", has_text=marker)
    assert row.locator(".live-call-description .agent-says-words").inner_text() == said  # text, never markup
    card.get_by_role("button", name="Approve once").click()
    result = wait_until(page, result_of(future), what="the approved call's result")
    assert isinstance(result, CallToolResult) and not result.is_error


def test_revoke_credential_on_a_live_row_asks_then_comes_back_to_live(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    name = f"live-revoke-{uuid.uuid4().hex[:8]}"
    token = server.create_token(name)  # its own: the module's token serves the other tests
    open_with_snapshot(page, f"{server.url}/admin/live/")
    marker = uuid.uuid4().hex[:12]
    command = f": {marker}; for i in $(seq 300); do echo line $i; sleep 0.1; done"
    future = call_in_thread(calls, server, "terminal_exec", {"command": command}, token=token)
    row = page.locator("#live-calls .live-call", has_text=marker)
    wait_until(page, lambda: "line 2\n" in row.locator(".live-call-output").inner_text(), what="the call's row")

    row.get_by_role("link", name="Revoke credential").click()
    page.wait_for_url(lambda url: "/revoke/" in url)
    assert "Revoking it stops, at once and for good" in page.locator("#content-main").inner_text()
    page.locator("#revoke-form input[type=submit]").click()
    page.wait_for_url(f"{server.url}/admin/live/")
    said = page.locator(".messagelist .success").inner_text()
    assert said.startswith(f"Revoked token “{name}”.")
    result = wait_until(page, result_of(future), what="the revoked credential's call to end")
    assert isinstance(result, CallToolResult) and result.is_error and "credential revoked" in text_of(result)
    revoked = audit_events(server, "token.revoked")[-1]
    assert revoked["username"] == "admin" and revoked["name"] == name


def test_a_long_outputs_row_keeps_its_newest_part_and_links_to_the_whole_on_the_calls_page(
    page: Page, server: LiveServer, calls: ThreadPoolExecutor
) -> None:
    """Past 64K characters a row keeps the newest: it says so, and the call's page replays all of it."""
    open_with_snapshot(page, f"{server.url}/admin/live/")
    marker = uuid.uuid4().hex[:12]
    command = f"echo {marker}-first; for i in $(seq 1 2000); do echo line-$i-........................; done; sleep 1"
    future = call_in_thread(calls, server, "terminal_exec", {"command": command})
    row = page.locator("#live-calls .live-call", has_text=marker)
    wait_until(page, lambda: "line-2000-" in (row.locator(".live-call-output").inner_text() or ""), "the last line")
    note = row.locator(".live-call-trimmed")
    shown = row.locator(".live-call-output")

    def settled() -> bool:  # the page may also be picking the output up from the recording meanwhile
        return note.is_visible() and f"{marker}-first" not in shown.inner_text() and "line-2000-" in shown.inner_text()

    wait_until(page, settled, "the newest output, with the note that earlier output is left out")
    assert "Earlier output is left out here" in note.inner_text()
    result = wait_until(page, result_of(future), what="the call's result")
    assert isinstance(result, CallToolResult) and not result.is_error
    note.get_by_role("link", name="the call's page replays all of it").click()
    page.wait_for_url("**/admin/audit/auditrecord/*/change/#recording")
    assert page.locator("#recording-player").count() == 1

    short = uuid.uuid4().hex[:12]
    open_with_snapshot(page, f"{server.url}/admin/live/")
    done = call_in_thread(calls, server, "terminal_exec", {"command": f"echo {short}; sleep 0.5"})
    wait_until(page, result_of(done), what="the short call's result")
    short_row = page.locator("#live-calls .live-call", has_text=short)
    wait_until(page, lambda: short_row.count() == 1, "the short call's row")
    assert not short_row.locator(".live-call-trimmed").is_visible()
