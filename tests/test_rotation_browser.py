"""Rotating all credentials in headless Chromium: the result page is reached by POST -> redirect -> GET, shows the
new token once, and neither a reload nor the Back button rotates a second time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page

from tests.browser import log_in_as_admin
from tests.live import LiveServer, running_server
from tests.oauth_flow import AdminSession, audit_events, mcp_status, obtain_tokens, register, shell

pytestmark = [pytest.mark.live, pytest.mark.browser]
ROTATE_PAGE = "/admin/oauth/credentialrotation/"
RESULT_URL = re.compile(r"/admin/oauth/credentialrotation/result/[^/]+/$")
ALREADY_SHOWN = "This result was already shown; the token cannot be shown again."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of this module's own: rotating would cut off every other module's tokens."""
    with running_server(tmp_path_factory.mktemp("rotation-browser")) as live:
        yield live


@pytest.fixture
def page(browser: Any, server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log_in_as_admin(page, server)
    yield page
    context.close()


def rotate(page: Page, server: LiveServer) -> str:
    """Rotate from the confirmation page; the secret the result page shows (its headers checked on the way)."""
    page.goto(f"{server.url}{ROTATE_PAGE}")
    with page.expect_navigation(url=RESULT_URL) as navigation:
        page.click("#rotate-now")
    response = navigation.value
    assert response is not None and response.request.method == "GET", "the result is a GET after a redirect"
    assert "no-store" in response.headers["cache-control"]
    secret = page.inner_text("#token-secret").strip()
    assert secret.startswith("sst_")
    return secret


def test_reloading_the_result_page_says_already_shown_and_does_not_rotate_again(page: Page, server: LiveServer) -> None:
    before = len(audit_events(server, "credentials.rotated"))
    server.create_token("cut-by-the-browser")
    page.goto(f"{server.url}{ROTATE_PAGE}")
    assert "cut-by-the-browser" in page.inner_text("#cut-bearer")
    secret = rotate(page, server)
    line = page.inner_text("#claude-line")
    assert line.startswith("claude mcp remove -s user sandstorm 2>/dev/null; claude mcp add -s user ")
    assert f"'Authorization: Bearer {secret}'" in line and server.mcp_url in line
    result_url = page.url

    reloaded = page.reload()
    assert reloaded is not None and "no-store" in reloaded.headers["cache-control"]
    assert page.url == result_url
    assert ALREADY_SHOWN in page.inner_text("#already-shown")
    assert secret not in page.content()
    assert page.get_attribute("#tokens-link", "href") == "/admin/oauth/bearertoken/"

    assert len(audit_events(server, "credentials.rotated")) == before + 1, "one rotation, not two"
    assert mcp_status(server, secret).status_code == 200, "the token shown first still works"


def test_the_back_button_after_rotating_does_not_rotate_again(page: Page, server: LiveServer) -> None:
    before = len(audit_events(server, "credentials.rotated"))
    secret = rotate(page, server)
    page.go_back()
    assert page.url == f"{server.url}{ROTATE_PAGE}", "back on the confirmation page, which only asks"
    page.go_forward()
    assert RESULT_URL.search(page.url)
    assert ALREADY_SHOWN in page.inner_text("#already-shown")
    page.go_back()
    page.go_back()
    page.go_forward()
    page.go_forward()
    assert ALREADY_SHOWN in page.inner_text("#already-shown")
    assert len(audit_events(server, "credentials.rotated")) == before + 1
    assert mcp_status(server, secret).status_code == 200
    assert secret not in page.content()


def test_a_rotation_with_no_confirm_field_rotates_nothing(page: Page, server: LiveServer) -> None:
    """The form's CSRF token is not enough: the POST must also carry confirm=rotate."""
    before = len(audit_events(server, "credentials.rotated"))
    page.goto(f"{server.url}{ROTATE_PAGE}")
    page.evaluate("document.querySelector('#rotate-form input[name=confirm]').remove()")
    page.click("#rotate-now")
    page.wait_for_load_state()
    assert page.url == f"{server.url}{ROTATE_PAGE}"
    assert page.locator("#token-secret").count() == 0
    assert len(audit_events(server, "credentials.rotated")) == before


def test_the_counts_promised_are_the_counts_cut_and_leave_out_what_no_longer_works(
    page: Page, server: LiveServer
) -> None:
    """The old page promised "3 bearer tokens" and reported "Revoked 5" (expired ones counted), and called client
    registration tokens access tokens."""
    rotate(page, server)  # start from nothing but the token this makes
    shell(
        server,
        "from datetime import timedelta; from django.utils import timezone; from oauth.models import BearerToken; "
        "BearerToken.objects.update(expires_at=timezone.now() - timedelta(days=1))",
    )  # every token so far has expired: none of them may be counted
    for name in ("count-a", "count-b"):
        server.create_token(name)
    client = register(server, client_name="Counted app")  # a registration token, and no access token yet
    session = AdminSession(server)
    try:
        obtain_tokens(server, session, client, scope="mcp:read")  # one real access token and one refresh token
    finally:
        session.close()

    page.goto(f"{server.url}{ROTATE_PAGE}")
    promised = {
        name: page.inner_text(f"#count-{name}") for name in ("bearer", "clients", "access", "refresh", "registration")
    }
    assert promised == {"bearer": "2", "clients": "1", "access": "1", "refresh": "1", "registration": "1"}
    cut = page.inner_text("#cut-bearer")
    assert "count-a" in cut and "count-b" in cut
    rotate(page, server)
    summary = page.inner_text("#rotation-summary")
    assert "2 bearer tokens" in summary and "1 OAuth access token" in summary and "Revoked 2 " in summary, summary
    [newest] = audit_events(server, "credentials.rotated")[-1:]
    detail = newest["detail"]
    assert (detail["bearer_tokens"], detail["access_tokens"], detail["clients"]) == (2, 1, 1)
