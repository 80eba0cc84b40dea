"""The console walked as an admin walks it, in headless Chromium: from a token's page to the calls of that token that
failed yesterday, and a crawl of every link the admin pages show, as a superuser and as a staff user who may only
view, which must meet no server error.

The crawl follows links only (GET): every state change in the console is a POST behind a confirmation page, so
following each link changes nothing; a link whose GET did change something would show up as a test of its own
failing, not here.
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser import log_in_as_admin
from tests.live import LiveServer
from tests.oauth_flow import AdminSession, bearer_token_id, obtain_tokens, register, shell
from tests.test_audit_list_browser import SEED, call

pytestmark = [pytest.mark.live, pytest.mark.browser]

# Links that end the session or leave the console; the crawl would sign itself out or wander off.
NOT_FOLLOWED = ("/admin/logout/", "/admin/second-factor/sign-out/", "/admin/password_change/")
MAX_PAGES = 600
VIEWER = "console-viewer"
VIEWER_PASSWORD = "viewer-password-1"


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def links_of(html: str) -> list[str]:
    parser = Links()
    parser.feed(html)
    return parser.hrefs


def token_id(server: LiveServer, name: str) -> str:
    return str(bearer_token_id(server, name))  # a credential id, as the audit records hold it: text


def test_yesterdays_failed_calls_of_a_token_are_one_click_from_its_page(
    admin_page: Page, live_server: LiveServer
) -> None:
    marker = uuid.uuid4().hex[:10]
    name = f"walk-{marker}"
    live_server.create_token(name)
    pk = token_id(live_server, name)
    other = (f"9{pk}0", f"walk-{marker}-other")
    midnight = datetime.combine(datetime.now(UTC).date(), time(), tzinfo=UTC)
    yesterday, mine = midnight - timedelta(days=1), (pk, name)
    calls = [
        call(marker, "y-failed", yesterday + timedelta(hours=9), mine, "terminal_exec", "error"),
        call(marker, "y-timeout", yesterday + timedelta(hours=10), mine, "terminal_exec", "timeout"),
        call(marker, "y-ok", yesterday + timedelta(hours=11), mine, "terminal_exec", "ok"),
        call(marker, "y-other", yesterday + timedelta(hours=12), other, "terminal_exec", "error"),
        call(marker, "t-failed", max(midnight, datetime.now(UTC) - timedelta(minutes=1)), mine, "file_read", "error"),
    ]
    live_server.manage("shell", "-c", SEED.format(spec=json.dumps({"calls": calls, "events": []})))

    page = admin_page
    page.goto(f"{live_server.url}/admin/oauth/bearertoken/{pk}/change/")
    page.click("#token-failed-yesterday")
    page.wait_for_url("**/admin/audit/auditrecord/?*")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    shown = rows.all_inner_texts()
    assert any(f"{marker} y-failed" in row for row in shown) and any(f"{marker} y-timeout" in row for row in shown)
    page.reload()
    expect(rows).to_have_count(2)  # the filters are in the URL


@pytest.fixture(scope="module")
def data_on_every_page(live_server: LiveServer) -> Iterator[None]:
    """A token with calls, a connected app with a live token, and a staff user who may only view."""
    name = f"crawl-{uuid.uuid4().hex[:8]}"
    live_server.create_token(name)
    client = register(live_server, client_name=f"Crawl app {name}")
    session = AdminSession(live_server)
    try:
        obtain_tokens(live_server, session, client, scope="mcp:read")
    finally:
        session.close()
    shell(
        live_server,
        "from django.contrib.auth.models import Permission, User; "
        f"u = User.objects.create_user({VIEWER!r}, password={VIEWER_PASSWORD!r}, is_staff=True); "
        "u.user_permissions.set(Permission.objects.filter(codename__startswith='view_')); print(u.pk)",
    )
    yield


def crawl(page: Page, server: LiveServer) -> tuple[int, list[str]]:
    """Every same-site /admin/ link reachable from the home page: (pages fetched, the ones that answered 5xx)."""
    base = urlsplit(server.url)
    seen = {"/admin/"}
    queue = deque(["/admin/"])
    failures: list[str] = []
    fetched = 0
    while queue and fetched < MAX_PAGES:
        path = queue.popleft()
        response = page.request.get(f"{server.url}{path}", max_redirects=0)
        fetched += 1
        if response.status >= 500:
            failures.append(f"{response.status} {path}")
            continue
        if "text/html" not in response.headers.get("content-type", ""):
            continue
        for href in links_of(response.text()):
            target = urlsplit(urldefrag(urljoin(f"{server.url}{path}", href))[0])
            if (target.scheme, target.netloc) != (base.scheme, base.netloc) or not target.path.startswith("/admin/"):
                continue
            link = target.path + (f"?{target.query}" if target.query else "")
            if link not in seen and not target.path.startswith(NOT_FOLLOWED):
                seen.add(link)
                queue.append(link)
    return fetched, failures


def test_every_admin_link_answers_without_a_server_error_for_a_superuser(
    admin_page: Page, live_server: LiveServer, data_on_every_page: None
) -> None:
    fetched, failures = crawl(admin_page, live_server)
    assert failures == []
    assert fetched > 50, "the crawl reached the console's pages"


def test_every_admin_link_answers_without_a_server_error_for_a_staff_user_who_may_only_view(
    browser: Browser, live_server: LiveServer, data_on_every_page: None
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        log_in_as_admin(page, live_server, username=VIEWER, password=VIEWER_PASSWORD)
        fetched, failures = crawl(page, live_server)
        assert failures == []
        assert fetched > 20
        # A viewer is shown no way to change anything: no add links, no revoke or rotation forms that would work.
        page.goto(f"{live_server.url}/admin/oauth/bearertoken/")
        assert page.locator("a.addlink").count() == 0
    finally:
        context.close()
