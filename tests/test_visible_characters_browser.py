"""In headless Chromium against the live server: a real command hiding a right-to-left override and terminal escapes,
and a client registered under a name with an override, are shown to the admin with those characters spelled out."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from playwright.sync_api import Browser, Page

from tests.browser import past_the_second_factor_offer
from tests.live import LiveServer, mcp_client, poll, text_of
from tests.oauth_flow import authorize_url, pkce, register

pytestmark = [pytest.mark.live, pytest.mark.browser]
RLO = "\u202e"
PAGE_DEADLINE = 15.0


def run_command(server: LiveServer, command: str) -> str:
    token = server.create_token(f"visible-{uuid.uuid4().hex[:8]}")

    async def call() -> str:
        async with mcp_client(server.mcp_url, token) as client:
            return text_of(await client.call_tool("terminal_exec", {"command": command}))

    # Playwright's sync API runs an event loop in this thread once the browser is up: the client gets a thread of its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, call).result(timeout=120)


def test_a_command_hiding_an_override_and_escapes_is_spelled_out_on_its_call_page(
    admin_page: Page, live_server: LiveServer
) -> None:
    marker = uuid.uuid4().hex[:12]
    output = run_command(live_server, f"echo {marker} {RLO}exe.txt; printf '\\033[2J'")
    assert f"{RLO}exe.txt" in output and "\x1b[2J" in output
    page = admin_page
    page.goto(f"{live_server.url}/admin/audit/auditrecord/?tool=terminal_exec")

    def row() -> object:
        found = page.locator("#result_list tbody tr", has_text=marker)
        if found.count() == 1 and found.locator("td.field-call_outcome").inner_text() == "ok":
            return found
        page.reload()
        return None

    poll(row, PAGE_DEADLINE, what="the call in the audit list")
    listed = page.locator("#result_list tbody tr", has_text=marker)
    assert f"{marker} ⟪U+202E⟫exe.txt" in listed.inner_text()
    listed.locator("th a").click()
    page.wait_for_selector("#call-arguments")
    assert f"echo {marker} ⟪U+202E⟫exe.txt" in page.inner_text("#call-arguments")
    shown = page.inner_text("#call-result")
    assert "⟪U+202E⟫exe.txt" in shown and "⟪U+001B⟫[2J" in shown
    assert RLO not in page.content() and "\x1b" not in page.content()
    page.reload()  # the same page again, as a reviewer would come back to it
    assert "⟪U+202E⟫exe.txt" in page.inner_text("#call-result")


def test_a_client_name_with_an_override_is_spelled_out_on_the_consent_page(
    browser: Browser, oauth_server: LiveServer
) -> None:
    client = register(oauth_server, "https://claude.ai/api/mcp/auth_callback", client_name=f"Claude{RLO}gnp.exe")
    context = browser.new_context()
    page = context.new_page()
    try:
        _, challenge = pkce()
        page.goto(authorize_url(oauth_server, client, challenge, state="visible"))
        page.fill("#id_username", "admin")
        page.fill("#id_password", oauth_server.admin_password)
        page.click("input[type=submit]")
        past_the_second_factor_offer(page, oauth_server)
        page.wait_for_selector("#consent-form")
        assert page.inner_text("#client-name") == "Claude⟪U+202E⟫gnp.exe"
        assert RLO not in page.content()
    finally:
        context.close()
