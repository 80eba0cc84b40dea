"""The credential pages in headless Chromium: create a token and reload its created page (no second token), revoke
from its page with confirmation, reach that confirmation from a call's page, refuse a duplicate name, and a connected
app's page after a real PKCE flow."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import anyio
import httpx2
import pytest
from playwright.sync_api import Page, expect

from tests.artifacts import artifact_dir
from tests.live import INITIALIZE, MCP_HEADERS, LiveServer, auth_headers, mcp_client
from tests.oauth_flow import AdminSession, obtain_tokens, register
from tests.oauth_flow import mcp_status as oauth_mcp_status

T = TypeVar("T")

pytestmark = [pytest.mark.live, pytest.mark.browser]


def mcp_status(server: LiveServer, token: str) -> int:
    response = httpx2.post(server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)}, timeout=10)
    return response.status_code


def run_async(work: Callable[[], Awaitable[T]]) -> T:
    """Run `work` on a thread of its own: Playwright's sync API keeps an event loop running in this one."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, work).result(timeout=60)


def tokens_named(server: LiveServer, name: str) -> int:
    return int(server.database.one("SELECT COUNT(*) AS n FROM oauth_bearertoken WHERE name = %s", name)["n"])


def create_in_the_form(page: Page, server: LiveServer, name: str, scope: str = "mcp") -> str:
    """Fill the token form, save; the secret on the page it redirects to."""
    page.goto(f"{server.url}/admin/oauth/bearertoken/add/")
    page.fill("#id_name", name)
    page.check(f"input[name=scope][value='{scope}']")
    page.check("input[name=expiry][value='7']")
    page.click("input[name=_save]")
    page.wait_for_selector("#token-secret")
    return page.inner_text("#token-secret").strip()


def test_a_token_created_in_the_admin_is_shown_once_and_a_reload_makes_no_second_one(
    admin_page: Page, live_server: LiveServer
) -> None:
    page = admin_page
    name = f"reload-{uuid.uuid4().hex[:8]}"
    page.goto(f"{live_server.url}/admin/oauth/bearertoken/add/")
    assert page.is_checked("input[name=scope][value='mcp:read']")  # read-only unless chosen otherwise
    assert page.locator("#id_user option:checked").inner_text() == "admin"  # the signed-in user
    secret = create_in_the_form(page, live_server, name)
    assert secret.startswith("sst_")
    line = page.inner_text("#claude-line")
    assert secret in line and live_server.mcp_url in line and "claude mcp remove -s user" in line
    assert page.locator("button.copy-button").first.is_visible()  # the script showed the copy buttons
    assert "/created/" in page.url and mcp_status(live_server, secret) == 200

    page.reload()
    assert page.locator("#already-shown").is_visible()
    assert secret not in page.content()
    assert tokens_named(live_server, name) == 1
    page.go_back()
    page.go_forward()
    assert secret not in page.content() and tokens_named(live_server, name) == 1
    page.click("#token-page")
    assert secret not in page.content() and secret[:8] in page.content()  # its page: the visible prefix only


def test_revoking_from_the_token_page_asks_first(admin_page: Page, live_server: LiveServer) -> None:
    page = admin_page
    page.set_viewport_size({"width": 1280, "height": 900})
    name = f"revoke-{uuid.uuid4().hex[:8]}"
    secret = create_in_the_form(page, live_server, name)

    async def call() -> None:
        async with mcp_client(live_server.mcp_url, secret) as client:
            await client.call_tool("terminal_exec", {"command": "echo from-the-token-page"})

    run_async(call)
    page.click("#token-page")
    assert page.inner_text("#token-status").startswith("active")
    assert "terminal_exec" in page.inner_text("#recent-calls")
    assert "127.0.0.1" in page.inner_text("#token-last-used")
    failed = page.get_attribute("#token-failed-yesterday", "href") or ""
    assert "credential=bearer%3A" in failed and "outcome=failed" in failed and "range=yesterday" in failed
    page.screenshot(path=str(artifact_dir() / "token-page.png"), full_page=True)

    page.click("#token-revoke")
    assert "background processes" in page.inner_text("#revoke-consequences")
    page.reload()  # the confirmation page, seen twice, revokes nothing
    assert mcp_status(live_server, secret) == 200
    page.click("#revoke-form input[type=submit]")
    assert "Revoked token" in page.inner_text(".messagelist")
    assert page.inner_text("#token-status").startswith("revoked")
    assert mcp_status(live_server, secret) == 401


def test_revoke_this_credential_on_a_call_page_reaches_the_confirmation(
    admin_page: Page, live_server: LiveServer
) -> None:
    name = f"call-page-{uuid.uuid4().hex[:8]}"
    secret = live_server.create_token(name)

    async def call() -> None:
        async with mcp_client(live_server.mcp_url, secret) as client:
            await client.call_tool("terminal_exec", {"command": f"echo {name}"})

    run_async(call)
    record = live_server.database.one(
        "SELECT id FROM audit_auditrecord WHERE kind = 'call.started' AND credential_name = %s ORDER BY id DESC LIMIT 1",
        name,
    )["id"]
    admin_page.goto(f"{live_server.url}/admin/audit/auditrecord/{record}/change/")
    admin_page.click("#revoke-credential")
    admin_page.wait_for_url("**/revoke/")
    expect(admin_page.locator("#revoke-form")).to_be_visible()
    assert mcp_status(live_server, secret) == 200
    admin_page.click("#revoke-form input[type=submit]")
    expect(admin_page.locator(".messagelist")).to_contain_text("Revoked")  # the redirect after the revocation
    assert mcp_status(live_server, secret) == 401


def test_a_duplicate_name_is_refused_in_the_form_and_by_create_token(admin_page: Page, live_server: LiveServer) -> None:
    name = f"dup-{uuid.uuid4().hex[:8]}"
    live_server.create_token(name)
    admin_page.goto(f"{live_server.url}/admin/oauth/bearertoken/add/")
    admin_page.fill("#id_name", name)
    admin_page.click("input[name=_save]")
    assert "is taken by token" in admin_page.inner_text(".errorlist")
    command = live_server.manage("create_token", name, check=False)
    assert command.returncode != 0 and "is taken by token" in command.stderr
    assert tokens_named(live_server, name) == 1


def test_a_connected_app_after_a_real_pkce_flow_shows_who_approved_it_and_its_token(
    admin_page: Page, live_server: LiveServer
) -> None:
    client_name = f"PKCE app {uuid.uuid4().hex[:8]}"
    client = register(live_server, client_name=client_name)
    session = AdminSession(live_server)
    try:
        tokens = obtain_tokens(live_server, session, client, scope="mcp:read")
    finally:
        session.close()
    assert oauth_mcp_status(live_server, str(tokens["access_token"])).status_code == 200

    page = admin_page
    page.goto(f"{live_server.url}/admin/")
    assert "Connected apps" in page.inner_text("#content-main")
    assert "DJANGO OAUTH TOOLKIT" not in page.inner_text("#content-main").upper()
    page.goto(f"{live_server.url}/admin/oauth/connectedapp/")
    page.click(f"text={client_name}")
    assert page.locator("a.viewsitelink").count() == 0
    approvals = page.inner_text("#app-approvals")
    assert "admin" in approvals and "approved" in approvals and "mcp:read" in approvals
    live = page.inner_text("#app-live-tokens")
    assert "admin" in live and "read-only tools" in live
    for link in page.locator(".object-tools a").all():
        response = page.request.get(f"{live_server.url}{link.get_attribute('href')}")
        assert response.status < 500, link.get_attribute("href")

    page.click("#app-revoke")
    page.wait_for_url("**/revoke/")
    assert oauth_mcp_status(live_server, str(tokens["access_token"])).status_code == 200
    page.click("#revoke-form input[type=submit]")
    expect(page.locator(".messagelist")).to_contain_text("Revoked every token")
    assert oauth_mcp_status(live_server, str(tokens["access_token"])).status_code == 401


def test_tokens_cannot_be_deleted_from_the_admin(admin_page: Page, live_server: LiveServer) -> None:
    live_server.create_token("undeletable")
    admin_page.goto(f"{live_server.url}/admin/oauth/bearertoken/")
    actions = admin_page.locator("select[name=action] option").all_inner_texts()
    assert not any("Delete" in action for action in actions)


def test_admin_pages_cannot_be_framed(live_server: LiveServer) -> None:
    response = httpx2.get(f"{live_server.url}/admin/login/", timeout=10)
    assert response.headers["x-frame-options"] == "DENY"
