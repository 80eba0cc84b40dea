"""The console's lists of credentials and approvals in headless Chromium at 1280×800: every column in the window
without scrolling sideways (an active, an expired and a revoked token told apart by their badges, the expiry in
view), a filter kept in the URL through a reload and undone by Back, and an approval request's page reached from its
list, with its call one click away and Back returning to it.

Rows are this module's own (names with a marker); the lists may hold other tests' rows too, which must fit as well.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from playwright.sync_api import Browser, FloatRect, Page, expect

from tests.artifacts import artifact_dir
from tests.browser import log_in_as_admin
from tests.live import LiveServer
from tests.oauth_flow import AdminSession, bearer_token_id, obtain_tokens, register, shell
from tests.test_audit_list_browser import SEED as CALL_SEED
from tests.test_audit_list_browser import call

pytestmark = [pytest.mark.live, pytest.mark.browser]

WIDTH, HEIGHT = 1280, 800
# An approval request for the seeded call, approved in the console with a 10-minute grant (MARKER, TOKEN and CALL
# replaced): printed, its id.
APPROVAL_SEED = """
from datetime import timedelta
from django.utils import timezone
from mcpserver.models import ApprovalGrant, ApprovalRequest
now = timezone.now()
asked = ApprovalRequest.objects.create(
    created_at=now - timedelta(seconds=12), expires_at=now + timedelta(minutes=5), state="approved", call_id="CALL",
    instance_id="lists-browser", tool="terminal_exec", arguments={"command": "git push --force origin MARKER"},
    arguments_sha256="0" * 64, shape="git push --force", username="admin", credential_key="bearer:TOKEN",
    credential_kind="bearer", credential_id="TOKEN", credential_name="list-MARKER-active", rule_id="force-push",
    rule_reason="a force push rewrites history", decided_by="admin", channel="console", decided_at=now,
    grant_minutes=10,
)
ApprovalGrant.objects.create(credential_key="bearer:TOKEN", tool="terminal_exec", shape="git push --force",
                             expires_at=now + timedelta(minutes=10), granted_by="admin", request=asked)
print(asked.pk)
"""


@dataclass(frozen=True)
class Seeded:
    marker: str
    app_name: str
    request_id: int
    call_record: int


@pytest.fixture(scope="module")
def seeded(live_server: LiveServer) -> Seeded:
    marker = uuid.uuid4().hex[:8]
    for state in ("active", "expired", "revoked"):
        live_server.create_token(f"list-{marker}-{state}")
    live_server.manage("revoke_token", f"list-{marker}-revoked")
    shell(
        live_server,
        "from datetime import timedelta; from django.utils import timezone; from oauth.models import BearerToken; "
        f"BearerToken.objects.filter(name='list-{marker}-expired').update(expires_at=timezone.now() - timedelta(days=1))",
    )
    app_name = f"List app {marker}"
    session = AdminSession(live_server)
    try:
        obtain_tokens(live_server, session, register(live_server, client_name=app_name), scope="mcp:read")
    finally:
        session.close()
    token = str(bearer_token_id(live_server, f"list-{marker}-active"))
    asked = call(marker, "ask", datetime.now(UTC), (token, f"list-{marker}-active"), "terminal_exec", "ok",
                 {"command": f"git push --force origin {marker}"})  # fmt: skip
    live_server.manage("shell", "-c", CALL_SEED.format(spec=json.dumps({"calls": [asked], "events": []})))
    code = APPROVAL_SEED.replace("MARKER", marker).replace("TOKEN", token).replace("CALL", str(asked["call_id"]))
    request_id = int(shell(live_server, code).strip().splitlines()[-1])
    sql = "SELECT id FROM audit_auditrecord WHERE kind = 'call.started' AND call_id = %s"
    call_record = int(live_server.database.one(sql, asked["call_id"])["id"])
    return Seeded(marker, app_name, request_id, call_record)


@pytest.fixture
def page(browser: Browser, live_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    signed_in = context.new_page()
    log_in_as_admin(signed_in, live_server)
    yield signed_in
    context.close()


def in_view(box: FloatRect | None) -> bool:
    """Wholly inside the 1280×800 window as it is, unscrolled."""
    if box is None:
        return False
    return box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= WIDTH and box["y"] + box["height"] <= HEIGHT


def widths(page: Page) -> dict[str, Any]:
    """[scrollWidth, clientWidth] of the list's box and of the page: equal when nothing scrolls sideways."""
    return dict(
        page.evaluate(
            """() => {
                const results = document.querySelector('#changelist-form .results');
                const root = document.documentElement;
                return {list: [results.scrollWidth, results.clientWidth], page: [root.scrollWidth, root.clientWidth]};
            }"""
        )
    )


def assert_no_sideways_scrolling(page: Page) -> None:
    sizes = widths(page)
    assert sizes["list"][0] <= sizes["list"][1] and sizes["page"][0] <= sizes["page"][1], sizes
    for header in page.locator("#result_list thead th").all():
        box = header.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, header.inner_text()


def test_the_token_list_tells_active_expired_and_revoked_apart_with_the_expiry_in_view(
    page: Page, live_server: LiveServer, seeded: Seeded
) -> None:
    page.goto(f"{live_server.url}/admin/oauth/bearertoken/?q=list-{seeded.marker}")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    page.screenshot(path=str(artifact_dir() / "token-list.png"))
    assert_no_sideways_scrolling(page)
    colours = set()
    for state in ("active", "expired", "revoked"):
        row = page.locator("#result_list tbody tr", has_text=f"list-{seeded.marker}-{state}")
        badge = row.locator("td.field-status .credential-status")
        assert badge.inner_text() == state and in_view(badge.bounding_box()), state
        colours.add(badge.evaluate("element => getComputedStyle(element).backgroundColor"))
        expires = row.locator("td.field-expires")
        assert in_view(expires.bounding_box()), state
    assert len(colours) == 3  # the word says it; the colours differ too
    assert in_view(page.locator("#result_list thead th.column-expires").bounding_box())
    expired = page.locator("#result_list tbody tr", has_text=f"list-{seeded.marker}-expired")
    assert expired.locator("td.field-expires").inner_text().endswith(" UTC")

    page.locator("#list-filters a", has_text="revoked").click()  # a filter of the bar above the rows
    page.wait_for_url(lambda url: "status=revoked" in url)
    expect(rows).to_have_count(1)
    page.reload()  # the filter is in the URL
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"list-{seeded.marker}-revoked")
    page.go_back()
    page.wait_for_url(lambda url: "status=" not in url)
    expect(rows).to_have_count(3)
    assert_no_sideways_scrolling(page)


@pytest.mark.parametrize("which", ["connected apps", "approval requests", "approval grants"])
def test_the_other_lists_fit_the_window_without_scrolling_sideways(
    page: Page, live_server: LiveServer, seeded: Seeded, which: str
) -> None:
    path, shown = {
        "connected apps": (f"/admin/oauth/connectedapp/?q={seeded.app_name}", seeded.app_name),
        "approval requests": (f"/admin/mcpserver/approvalrequest/?q=list-{seeded.marker}", f"R-{seeded.request_id}"),
        "approval grants": ("/admin/mcpserver/approvalgrant/", f"R-{seeded.request_id}"),
    }[which]
    page.goto(f"{live_server.url}{path}")
    row = page.locator("#result_list tbody tr", has_text=shown)
    expect(row).to_have_count(1)
    page.screenshot(path=str(artifact_dir() / f"{which.replace(' ', '-')}-list.png"))
    assert_no_sideways_scrolling(page)
    badge = row.locator(".credential-status")
    assert badge.inner_text() in ("active", "approved") and in_view(badge.bounding_box())
    assert in_view(row.locator("td").last.bounding_box())  # the last column: expiry, or the decision


def test_an_approval_request_page_names_the_call_rule_decider_channel_and_time_and_back_returns_to_it(
    page: Page, live_server: LiveServer, seeded: Seeded
) -> None:
    page.goto(f"{live_server.url}/admin/mcpserver/approvalrequest/?q=list-{seeded.marker}")
    page.get_by_role("link", name=f"R-{seeded.request_id}", exact=True).click()
    page.wait_for_url(lambda url: f"/approvalrequest/{seeded.request_id}/change/" in url)
    expect(page.locator("h1")).to_have_text(f"Approval request R-{seeded.request_id}")
    expect(page.locator("#request-rule")).to_contain_text("force-push: a force push rewrites history")
    expect(page.locator("#request-decided")).to_contain_text("approved by admin through the console")
    expect(page.locator("#request-decided")).to_contain_text(" UTC")
    expect(page.locator("#request-who")).to_contain_text(f"list-{seeded.marker}-active")
    page.screenshot(path=str(artifact_dir() / "approval-request-page.png"), full_page=True)
    request_url = page.url

    page.locator("#request-call a").click()
    page.wait_for_url(f"**/admin/audit/auditrecord/{seeded.call_record}/change/")
    page.go_back()
    page.wait_for_url(request_url)
    expect(page.locator("#request-call a")).to_be_visible()
    page.reload()
    expect(page.locator("#request-decided")).to_contain_text("through the console")
