"""A token's confinement profile in headless Chromium: made `host` in the form (a warning badge on its created page,
in the list and on its page), changed to `workspace` on its page, which a reload and Back do not undo or repeat."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import Page, expect

from tests.artifacts import artifact_dir
from tests.live import LiveServer

pytestmark = [pytest.mark.live, pytest.mark.browser]
HOST_BADGE = ".credential-confinement-host"


def confinement_changes(server: LiveServer, name: str) -> int:
    sql = "SELECT COUNT(*) AS n FROM audit_auditrecord WHERE event = 'token.confinement_changed' AND CAST(detail AS TEXT) LIKE %s"
    return int(server.database.one(sql, f'%"{name}"%')["n"])


def stored_profile(server: LiveServer, name: str) -> str:
    return str(server.database.one("SELECT confinement FROM oauth_bearertoken WHERE name = %s", name)["confinement"])


def test_a_host_token_is_badged_and_changed_to_workspace_on_its_page(admin_page: Page, live_server: LiveServer) -> None:
    page = admin_page
    name = f"confined-{uuid.uuid4().hex[:8]}"
    page.goto(f"{live_server.url}/admin/oauth/bearertoken/add/")
    assert page.is_checked("input[name=confinement][value='']")  # the installation's default unless chosen
    page.fill("#id_name", name)
    page.check("input[name=scope][value='mcp']")
    page.check("input[name=confinement][value='host']")
    page.click("input[name=_save]")
    page.wait_for_selector("#token-secret")
    expect(page.locator(f"#token-confinement {HOST_BADGE}")).to_be_visible()

    page.goto(f"{live_server.url}/admin/oauth/bearertoken/?q={name}")
    expect(page.locator(f"#result_list {HOST_BADGE}")).to_have_count(1)
    page.click(f"#result_list a:text-is('{name}')")
    expect(page.locator(f"#token-confinement {HOST_BADGE}")).to_contain_text("host")
    page.screenshot(path=str(artifact_dir() / "token-confinement-host.png"), full_page=True)
    token_url = page.url

    page.check("input[name=confinement][value='workspace']")
    page.click("input[name=_continue]")  # "Save and continue editing": back on its page
    expect(page.locator(".messagelist")).to_be_visible()
    expect(page.locator("#token-confinement")).to_contain_text("confined to the workspace")
    expect(page.locator(HOST_BADGE)).to_have_count(0)
    assert stored_profile(live_server, name) == "workspace" and confinement_changes(live_server, name) == 1

    page.reload()  # a reload shows the page again, and posts nothing
    expect(page.locator("#token-confinement .credential-confinement-workspace")).to_be_visible()
    assert page.is_checked("input[name=confinement][value='workspace']")
    page.go_back()  # to the page as it was before the change: fetched anew, so it shows the change
    page.wait_for_url(token_url)
    expect(page.locator("#token-confinement")).to_contain_text("confined to the workspace")
    expect(page.locator(HOST_BADGE)).to_have_count(0)
    assert stored_profile(live_server, name) == "workspace" and confinement_changes(live_server, name) == 1
