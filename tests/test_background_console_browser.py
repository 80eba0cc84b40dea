"""The console's background commands in headless Chromium, as an admin meets them: every user's commands with the
state the executor reports, stopping a running one (its process group ends, the audit log says who stopped it),
reload and Back after the action, and a command that was not running left alone."""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from playwright.sync_api import Locator, Page

from tests.live import LiveServer, mcp_client, poll, text_of

pytestmark = [pytest.mark.live, pytest.mark.browser]
DEADLINE = 15.0
LIST = "/admin/mcpserver/backgroundprocess/"


def start(server: LiveServer, token: str, command: str) -> int:
    async def call() -> int:
        async with mcp_client(server.mcp_url, token) as client:
            result = await client.call_tool("terminal_exec_background", {"command": command})
            assert not result.is_error, text_of(result)
            return int(text_of(result).split()[1])

    # Playwright's sync API runs an event loop in this thread: the client gets a thread of its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, call).result(timeout=60)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def row_of(page: Page, pid: int) -> Locator:
    return page.locator("#result_list tbody tr", has=page.locator("td.field-pid", has_text=str(pid)))


def test_an_admin_sees_every_users_commands_and_stops_a_running_one(admin_page: Page, live_server: LiveServer) -> None:
    marker = uuid.uuid4().hex[:10]
    other = live_server.create_token(f"console-{marker}")
    running = start(live_server, other, f"sleep 300 # {marker}-running")
    finished = start(live_server, other, f"echo done; exit 5 # {marker}-finished")
    page = admin_page
    page.goto(f"{live_server.url}/admin/")
    page.get_by_role("link", name="Background commands").click()
    page.wait_for_url(f"**{LIST}")

    def states() -> dict[int, str] | None:
        found = {pid: row_of(page, pid).locator("td.field-state").inner_text() for pid in (running, finished)}
        if found[finished].startswith("running"):
            page.reload()
            return None
        return found

    seen = poll(states, DEADLINE, what="both commands with their states")
    assert seen == {running: "running", finished: "exited with code 5"}
    assert marker in row_of(page, running).locator("td.field-short_command").inner_text()

    for pid in (running, finished):
        row_of(page, pid).locator("input[name=_selected_action]").check()
    page.select_option("select[name=action]", "stop")
    page.click("button[name=index]")  # the actions bar's Go
    page.wait_for_url(f"**{LIST}")
    message = page.locator("ul.messagelist li").inner_text()
    assert message == "Sent SIGTERM to 1 background command; 1 was not running."
    deadline = time.monotonic() + DEADLINE
    while alive(running) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(running)

    page.reload()  # a reload shows the new state and repeats nothing
    poll(
        lambda: (
            row_of(page, running).locator("td.field-state").inner_text().startswith("killed by SIGTERM")
            or page.reload()
        ),
        DEADLINE,
        what="the stopped command shown as killed",
    )
    assert page.locator("ul.messagelist").count() == 0
    page.go_back()
    page.wait_for_url(f"**{LIST}")

    page.goto(f"{live_server.url}/admin/audit/securityevent/")
    # Its `background.ended` event names the command too (tests/test_job_recordings_live.py).
    rows = page.locator("#result_list tbody tr", has_text=f"{marker}-running")
    sentence = rows.filter(has_text="from the console").inner_text()
    assert "stopped 1 background command from the console" in sentence and f"{marker}-finished" not in sentence
