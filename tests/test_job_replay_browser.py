"""Replaying a terminal session in headless Chromium: a background command run in a pseudo-terminal, answered through
terminal_input, is reached from the console's Background commands page, plays in its call's player with what was
typed and what it printed, and downloads as asciicast v2 with the typed input as input events; the page survives a
reload and the Back button."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from playwright.sync_api import Browser, Page

from tests.browser import log_in_as_admin, wait_until
from tests.live import LiveServer, mcp_client, poll, text_of

pytestmark = [pytest.mark.live, pytest.mark.browser]

JOBS = "/admin/mcpserver/backgroundprocess/"
PLAYER = "#recording-player"
TERMINAL = "#recording-player .ap-term-text"


@pytest.fixture(scope="module")
def session_job(live_server: LiveServer) -> tuple[str, int]:
    """A PTY job that asks a question, answered through terminal_input; its marker and its call's started record."""
    marker = f"pty-{uuid.uuid4().hex[:8]}"
    token = live_server.create_token(f"replay-{marker}")
    command = (
        f"read -p 'Who is there? ' name; sleep 0.3; printf '\\033[33mhello %s\\033[0m\\n' \"$name\"; echo {marker}"
    )

    async def run() -> None:
        async with mcp_client(live_server.mcp_url, token) as client:
            started = await client.call_tool("terminal_exec_background", {"command": command, "pty": True})
            pid = int(text_of(started).split()[1])
            asked = await client.call_tool("terminal_output", {"id": pid, "wait_ms": 10_000})
            assert "Who is there? " in text_of(asked), text_of(asked)
            typed = await client.call_tool("terminal_input", {"id": pid, "text": "ada\r"})
            assert not typed.is_error, text_of(typed)

    with ThreadPoolExecutor(max_workers=1) as pool:  # Playwright's sync API holds this thread's event loop
        pool.submit(anyio.run, run).result(timeout=120)

    def kept() -> int | None:
        rows = live_server.database.query(
            "SELECT s.id FROM audit_auditrecord s JOIN audit_auditrecord e ON e.call_id = s.call_id"
            " AND e.kind = 'event' AND e.event = 'background.ended'"
            " WHERE s.kind = 'call.started' AND s.tool = 'terminal_exec_background' ORDER BY s.id DESC"
        )
        for row in rows:
            found = live_server.database.query("SELECT arguments FROM audit_auditrecord WHERE id = %s", row["id"])
            if marker in str(found[0]["arguments"]):
                return int(row["id"])
        return None

    return marker, poll(kept, 30, what="the job's background.ended event")


@pytest.fixture
def admin_page(browser: Browser, live_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    log_in_as_admin(page, live_server)
    yield page
    context.close()


def screen(page: Page) -> str:
    return page.inner_text(TERMINAL) if page.locator(TERMINAL).count() else ""


def test_an_admin_replays_a_terminal_session_from_the_background_commands_page(
    admin_page: Page, live_server: LiveServer, session_job: tuple[str, int], tmp_path: Path
) -> None:
    marker, record_id = session_job
    page = admin_page
    page.goto(f"{live_server.url}{JOBS}")
    row = page.locator("#result_list tbody tr", has_text=marker)
    row.get_by_role("link", name="▶ replay").click()
    page.wait_for_url(f"**/admin/audit/auditrecord/{record_id}/change/#recording")
    assert page.inner_text("#content h1").startswith("terminal_exec_background by admin — ")
    page.wait_for_selector(f"{PLAYER} .ap-player")
    page.select_option("#recording-speed", "4")
    page.locator(f"{PLAYER} .ap-playback-button").click()
    wait_until(page, lambda: marker in screen(page), "the replay to reach the last line")
    shown = screen(page)
    assert "Who is there? ada" in shown and "hello ada" in shown, shown  # the terminal echoed what was typed
    yellow = page.locator(f"{TERMINAL} .ap-line span", has_text="hello ada").first
    plain = page.locator(f"{TERMINAL} .ap-line span", has_text=marker).first
    assert yellow.evaluate("e => getComputedStyle(e).color") != plain.evaluate("e => getComputedStyle(e).color")

    page.fill("#recording-query", "hello")
    page.press("#recording-query", "Enter")
    wait_until(page, lambda: page.locator("#recording-hits button").count() == 1, "one hit for 'hello'")

    with page.expect_download() as download_info:
        page.click("#recording-download")
    target = tmp_path / "session.cast"
    download_info.value.save_as(target)
    header, *events = [json.loads(line) for line in target.read_text().splitlines()]
    assert header["version"] == 2
    assert ["i", "ada\r"] in [event[1:] for event in events]
    assert marker in "".join(text for _at, code, text in events if code == "o")

    page.reload()
    page.wait_for_selector(f"{PLAYER} .ap-player")
    page.go_back()
    page.wait_for_url(f"{live_server.url}{JOBS}")
    assert page.locator("#result_list tbody tr", has_text=marker).get_by_role("link", name="▶ replay").count() == 1
