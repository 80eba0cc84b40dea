"""Replaying a call in headless Chromium against the live server: a slow, coloured command made through MCP is
reached from the list's "▶ replay" link, plays in the call page's player with its colours, at the speed chosen, is
searched and sought from a hit, and downloads as asciicast v2; the page survives a reload and the Back button, and
staff who may only view the audit log replay it too. What the page shows as text: tests/test_recording_page.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from playwright.sync_api import Browser, Page

from tests.browser import log_in_as_admin, wait_until
from tests.live import LiveServer, mcp_client, poll, text_of
from tests.oauth_flow import shell

pytestmark = [pytest.mark.live, pytest.mark.browser]

LIST = "/admin/audit/auditrecord/"
# Three green lines 0.3 s apart, then a plain one: about a second to replay.
COMMAND = 'for i in 1 2 3; do printf "\\033[32mline $i\\033[0m\\n"; sleep 0.3; done; echo {marker}'
PLAYER = "#recording-player"
TERMINAL = "#recording-player .ap-term-text"
VIEWER_PASSWORD = "replay-viewer-password-1"


@dataclass(frozen=True)
class RecordedCall:
    marker: str  # the command's last line, "done-<hex>"
    record_id: int
    call_id: str


@pytest.fixture(scope="module")
def recorded(live_server: LiveServer) -> RecordedCall:
    marker = f"done-{uuid.uuid4().hex[:10]}"
    token = live_server.create_token(f"replay-{marker}")

    async def call() -> str:
        async with mcp_client(live_server.mcp_url, token) as client:
            return text_of(await client.call_tool("terminal_exec", {"command": COMMAND.format(marker=marker)}))

    # Playwright's sync API runs an event loop in this thread once the browser is up: the client gets a thread of
    # its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert marker in pool.submit(anyio.run, call).result(timeout=120)

    def finished() -> RecordedCall | None:
        rows = live_server.database.query(
            "SELECT s.id, s.call_id, s.arguments, f.detail FROM audit_auditrecord s JOIN audit_auditrecord f"
            " ON f.call_id = s.call_id AND f.kind = 'call.finished' WHERE s.kind = 'call.started' ORDER BY s.id DESC"
        )
        for row in rows:
            detail = json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]  # text on SQLite
            if marker in str(row["arguments"]) and "recording" in (detail or {}):
                return RecordedCall(marker, int(row["id"]), str(row["call_id"]))
        return None

    return poll(finished, 15, what="the call's finished record with its recording")


@pytest.fixture
def admin_page(browser: Browser, live_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    log_in_as_admin(page, live_server)
    yield page
    context.close()


def current_time(page: Page) -> float:
    return float(page.evaluate("document.getElementById('recording').player.getCurrentTime() || 0"))


def screen(page: Page) -> str:
    return page.inner_text(TERMINAL) if page.locator(TERMINAL).count() else ""


def search(page: Page, query: str) -> None:
    page.fill("#recording-query", query)
    page.press("#recording-query", "Enter")
    wait_until(page, lambda: page.locator("#recording-hits button").count() > 0, f"a hit for {query!r}")


def colour_of(page: Page, text: str) -> str:
    """The computed colour of the terminal's span that shows `text`."""
    span = page.locator(f"{TERMINAL} .ap-line span", has_text=text).first
    return str(span.evaluate("element => getComputedStyle(element).color"))


def test_an_admin_replays_a_call_from_the_list_with_its_colours_speed_search_and_download(
    admin_page: Page, live_server: LiveServer, recorded: RecordedCall, tmp_path: Path
) -> None:
    page = admin_page
    page.goto(f"{live_server.url}{LIST}")
    row = page.locator("#result_list tbody tr", has=page.locator(f"a[href='{LIST}{recorded.record_id}/change/']"))
    row.get_by_role("link", name="▶ replay").click()
    page.wait_for_url(f"**{LIST}{recorded.record_id}/change/#recording")
    heading = page.inner_text("#content h1")
    assert heading.startswith("terminal_exec by admin — ") and heading.endswith(" UTC"), heading
    page.wait_for_selector(f"{PLAYER} .ap-player")

    # Half speed: the player's clock runs at half the page's (both measured in the page, so a slow machine cannot
    # make it look right or wrong).
    page.select_option("#recording-speed", "0.5")
    page.locator(f"{PLAYER} .ap-playback-button").click()
    wait_until(page, lambda: current_time(page) > 0, "the player to play")
    rate = page.evaluate(
        """async () => {
            const player = document.getElementById('recording').player;
            const [played, wall] = [player.getCurrentTime(), performance.now()];
            await new Promise((done) => setTimeout(done, 300));
            return (player.getCurrentTime() - played) / ((performance.now() - wall) / 1000);
        }"""
    )
    assert 0.3 < rate < 0.7, rate
    page.select_option("#recording-speed", "4")  # while it plays: a new player, playing on from there
    wait_until(page, lambda: recorded.marker in screen(page), "the replay to reach the last line")
    assert "line 1" in screen(page) and "line 3" in screen(page)
    green, plain = colour_of(page, "line 1"), colour_of(page, recorded.marker)
    assert green != plain and green.startswith("rgb("), (green, plain)

    search(page, "LINE 2")  # case aside
    hits = page.locator("#recording-hits button")
    assert hits.count() == 1 and "line 2" in hits.inner_text()
    hit_time = float(hits.get_attribute("data-time") or "nan")
    end = current_time(page)
    assert 0.2 < hit_time < end, (hit_time, end)
    hits.click()
    wait_until(page, lambda: abs(current_time(page) - hit_time) < 0.05, "the player to seek to the hit")
    wait_until(page, lambda: "line 2" in screen(page) and "line 3" not in screen(page), "the screen at the hit")

    with page.expect_download() as download_info:
        page.click("#recording-download")
    download = download_info.value
    assert download.suggested_filename == f"sandstorm-{recorded.call_id}.cast"
    target = tmp_path / "call.cast"
    download.save_as(target)
    header, *events = [json.loads(line) for line in target.read_text().splitlines()]
    assert header["version"] == 2 and header["width"] > 0 and header["height"] > 0
    played = "".join(text for _at, code, text in events if code == "o")
    for number in (1, 2, 3):
        assert f"\x1b[32mline {number}\x1b[0m\r\n" in played, played
    assert f"{recorded.marker}\r\n" in played


def test_the_call_page_works_after_a_reload_and_the_back_button(
    admin_page: Page, live_server: LiveServer, recorded: RecordedCall
) -> None:
    page = admin_page
    page.goto(f"{live_server.url}{LIST}")
    page.locator(f"a[href='{LIST}{recorded.record_id}/change/#recording']").click()
    page.wait_for_selector(f"{PLAYER} .ap-player")
    search(page, "line 3")
    page.reload()
    page.wait_for_selector(f"{PLAYER} .ap-player")
    assert page.input_value("#recording-query") == "" and page.locator("#recording-hits li").count() == 0
    search(page, recorded.marker)
    page.locator("#recording-hits button").click()
    wait_until(page, lambda: recorded.marker in screen(page), "the screen at the last line after a reload")

    page.go_back()
    page.wait_for_url(f"{live_server.url}{LIST}")
    assert page.locator(f"a[href='{LIST}{recorded.record_id}/change/#recording']").count() == 1
    page.go_forward()
    page.wait_for_selector(f"{PLAYER} .ap-player")
    search(page, "line 1")
    page.locator("#recording-hits button").click()
    wait_until(page, lambda: "line 1" in screen(page), "the screen at the first line after Back and Forward")


def test_staff_who_may_only_view_the_audit_log_replay_a_call(
    browser: Browser, live_server: LiveServer, recorded: RecordedCall
) -> None:
    username = f"replay-viewer-{uuid.uuid4().hex[:8]}"
    shell(
        live_server,
        "from django.contrib.auth.models import Permission, User; "
        f"u = User.objects.create_user({username!r}, password={VIEWER_PASSWORD!r}, is_staff=True); "
        "u.user_permissions.set(Permission.objects.filter(codename='view_auditrecord'))",
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        log_in_as_admin(page, live_server, username, VIEWER_PASSWORD)
        page.goto(f"{live_server.url}{LIST}{recorded.record_id}/change/#recording")
        page.wait_for_selector(f"{PLAYER} .ap-player")
        search(page, "line 3")
        page.locator("#recording-hits button").click()
        wait_until(page, lambda: "line 3" in screen(page), "the screen at the third line")
        download = page.request.get(f"{live_server.url}{page.get_attribute('#recording-download', 'href')}")
        assert download.status == 200 and recorded.marker in download.text()
    finally:
        context.close()
