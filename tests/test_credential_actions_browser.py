"""Regenerating a token and disconnecting an MCP session in headless Chromium: the new secret is reached by
POST -> redirect -> GET and shown once, neither a reload nor the Back button regenerates again; the sessions page
lists a session opened with the token, and Disconnect (after its confirmation) ends it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Page

from tests.browser import log_in_as_admin
from tests.live import INITIALIZE, MCP_HEADERS, LiveServer
from tests.oauth_flow import bearer_token_id, mcp_status

pytestmark = [pytest.mark.live, pytest.mark.browser]
CREATED_URL = re.compile(r"/admin/oauth/bearertoken/\d+/created/[^/]+/$")


@pytest.fixture
def page(browser: Any, live_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log_in_as_admin(page, live_server)
    yield page
    context.close()


def unrevoked_named(server: LiveServer, name: str) -> int:
    sql = "SELECT id FROM oauth_bearertoken WHERE name = %s AND revoked_at IS NULL"
    return len(server.database.query(sql, name))


def named(server: LiveServer, name: str) -> int:
    return len(server.database.query("SELECT id FROM oauth_bearertoken WHERE name = %s", name))


def test_regenerate_shows_the_new_secret_once_and_neither_reload_nor_back_regenerates(
    page: Page, live_server: LiveServer
) -> None:
    name = f"regen-{uuid.uuid4().hex[:8]}"
    old = live_server.create_token(name)
    token_page = f"{live_server.url}/admin/oauth/bearertoken/{bearer_token_id(live_server, name)}/change/"
    page.goto(token_page)
    page.click("#token-regenerate")
    assert "gives it a new secret" in page.inner_text("#content-main")
    assert named(live_server, name) == 1, "the confirmation only asks"
    with page.expect_navigation(url=CREATED_URL) as navigation:
        page.click("#regenerate-now")
    response = navigation.value
    assert response is not None and response.request.method == "GET" and "no-store" in response.headers["cache-control"]
    secret = page.inner_text("#token-secret").strip()
    assert secret.startswith("sst_") and secret != old
    assert f"'Authorization: Bearer {secret}'" in page.inner_text("#claude-line")
    assert page.locator("#regenerated-from").count() == 1
    assert mcp_status(live_server, secret).status_code == 200 and mcp_status(live_server, old).status_code == 401

    page.reload()
    assert page.locator("#already-shown").count() == 1 and secret not in page.content()
    page.go_back()  # to the confirmation, which now says the token was revoked and asks nothing
    assert page.locator("#regenerate-already").count() == 1 and page.locator("#regenerate-form").count() == 0
    page.click("#current-token")
    assert page.inner_text("#token-status").startswith("active")
    page.go_back()
    page.go_forward()
    assert (named(live_server, name), unrevoked_named(live_server, name)) == (2, 1), "regenerated once"
    assert mcp_status(live_server, secret).status_code == 200


def test_the_sessions_page_disconnects_a_session(page: Page, live_server: LiveServer) -> None:
    name = f"session-{uuid.uuid4().hex[:8]}"
    token = live_server.create_token(name)
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}", "User-Agent": "browser-test-agent/1"}
    with httpx2.Client(base_url=live_server.url, headers=headers, timeout=15) as http:
        opened = http.post("/mcp", json=INITIALIZE)
        session_id = opened.headers["mcp-session-id"]
        in_session = {"mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
        assert http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                         headers=in_session).status_code == 202  # fmt: skip
        tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert http.post("/mcp", json=tools_list, headers=in_session).status_code == 200

        page.goto(f"{live_server.url}/admin/")
        page.click("#task-sessions")
        row = page.locator(f'tr.open-session[data-session="{session_id}"]')
        assert name in row.inner_text() and "browser-test-agent/1" in row.inner_text()
        row.locator("a.session-disconnect").click()
        assert "revokes nothing" in page.inner_text("#disconnect-consequences")
        assert http.post("/mcp", json=tools_list, headers=in_session).status_code == 200, "the confirmation only asks"
        page.click("#disconnect-now")
        page.wait_for_url(re.compile(r"/admin/sessions/"))
        assert "Disconnected the MCP session" in page.inner_text(".messagelist")
        assert page.locator(f'tr.open-session[data-session="{session_id}"]').count() == 0
        assert http.post("/mcp", json=tools_list, headers=in_session).status_code == 404, "the client must initialize"
        assert http.post("/mcp", json=INITIALIZE).status_code == 200, "and may at once"
