"""The token admin in headless Chromium: log in, create a token, see its secret once, use it, revoke it."""

from __future__ import annotations

import httpx2
import pytest
from playwright.sync_api import Page

from tests.live import INITIALIZE, MCP_HEADERS, LiveServer, auth_headers

pytestmark = [pytest.mark.live, pytest.mark.browser]


def mcp_status(server: LiveServer, token: str) -> int:
    response = httpx2.post(server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)}, timeout=10)
    return response.status_code


def test_a_token_created_in_the_admin_is_shown_once_works_and_can_be_revoked(
    admin_page: Page, live_server: LiveServer
) -> None:
    page = admin_page
    page.goto(f"{live_server.url}/admin/oauth/bearertoken/add/")
    page.fill("#id_name", "from-the-browser")
    page.select_option("#id_user", label="admin")
    page.select_option("#id_scope", value="mcp")
    page.click("input[name=_save]")
    secret = page.inner_text("#token-secret").strip()
    assert secret.startswith("sst_")
    assert secret in page.inner_text("#claude-line") and live_server.mcp_url in page.inner_text("#claude-line")
    assert mcp_status(live_server, secret) == 200

    page.goto(f"{live_server.url}/admin/oauth/bearertoken/")
    assert secret not in page.content()
    page.click("text=from-the-browser")
    assert secret not in page.content()
    assert secret[:8] in page.content()  # the visible prefix, to recognise it

    page.goto(f"{live_server.url}/admin/oauth/bearertoken/")
    row = page.locator("tr", has_text="from-the-browser")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", value="revoke")
    page.click("button[name=index]")
    assert "Revoked 1 token" in page.inner_text(".messagelist")
    assert mcp_status(live_server, secret) == 401


def test_tokens_cannot_be_deleted_from_the_admin(admin_page: Page, live_server: LiveServer) -> None:
    live_server.create_token("undeletable")
    admin_page.goto(f"{live_server.url}/admin/oauth/bearertoken/")
    actions = admin_page.locator("select[name=action] option").all_inner_texts()
    assert not any("Delete" in action for action in actions)


def test_admin_pages_cannot_be_framed(live_server: LiveServer) -> None:
    response = httpx2.get(f"{live_server.url}/admin/login/", timeout=10)
    assert response.headers["x-frame-options"] == "DENY"
