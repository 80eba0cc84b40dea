"""The consent flow in headless Chromium: the admin's login page, the consent page's content, Approve and Deny."""

from __future__ import annotations

import getpass
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, Route

from tests.browser import past_the_second_factor_offer
from tests.live import LiveServer
from tests.oauth_flow import Client, authorize_url, pkce, query_of, register

pytestmark = [pytest.mark.live, pytest.mark.browser]
CALLBACK = "https://claude.ai/api/mcp/auth_callback"


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    # The machine has no network: answer the client's callback here and remember where the browser was sent.
    page.route("https://claude.ai/**", lambda route: route.fulfill(status=200, body="callback reached"))
    yield page
    context.close()


def sign_in_through_consent(page: Page, server: LiveServer, client: Client, state: str) -> None:
    _, challenge = pkce()
    page.goto(authorize_url(server, client, challenge, state=state))
    assert page.url.startswith(f"{server.url}/admin/login/?next=/oauth/authorize/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", server.admin_password)
    page.click("input[type=submit]")
    past_the_second_factor_offer(page, server)
    page.wait_for_selector("#consent-form")


def test_approve_in_the_browser_redirects_with_code_state_and_iss(page: Page, server: LiveServer) -> None:
    client = register(server, CALLBACK, client_name="Claude")
    sign_in_through_consent(page, server, client, "browser-state")

    assert page.inner_text("#client-name") == "Claude"
    assert page.inner_text("#redirect-host") == "claude.ai"
    scope = page.inner_text("#scope")
    assert f"Run any command as {getpass.getuser()} on this host" in scope
    assert page.is_visible("#recent-warning")  # registered seconds ago
    assert not page.is_visible("#loopback-warning")
    assert page.is_visible("#approve") and page.is_visible("#deny")

    with page.expect_request(lambda request: request.url.startswith(CALLBACK)) as reached:
        page.click("#approve")
    answer = query_of(reached.value.url)
    assert answer["code"] and answer["state"] == "browser-state" and answer["iss"] == server.url


def test_deny_in_the_browser_redirects_with_access_denied(page: Page, server: LiveServer) -> None:
    client = register(server, CALLBACK, client_name="Someone else")
    sign_in_through_consent(page, server, client, "deny-state")
    with page.expect_request(lambda request: request.url.startswith(CALLBACK)) as reached:
        page.click("#deny")
    answer = query_of(reached.value.url)
    assert answer["error"] == "access_denied" and answer["state"] == "deny-state" and "code" not in answer


def test_a_loopback_client_is_flagged_on_the_consent_page(page: Page, server: LiveServer) -> None:
    client = register(
        server, "http://127.0.0.1:40111/callback", client_name="Claude Code", token_endpoint_auth_method="none"
    )
    page.route("http://127.0.0.1:40111/**", lambda route: route.fulfill(status=200, body="loopback reached"))
    sign_in_through_consent(page, server, client, "loop-state")
    assert page.inner_text("#redirect-host") == "127.0.0.1:40111"
    assert "loopback" in page.inner_text("#loopback-warning")
    with page.expect_request(lambda request: request.url.startswith("http://127.0.0.1:40111/callback")) as reached:
        page.click("#approve")
    assert query_of(reached.value.url)["code"]


def test_the_consent_page_renders_inside_no_frame(page: Page, server: LiveServer) -> None:
    client = register(server, CALLBACK)
    sign_in_through_consent(page, server, client, "frame-state")
    consent_url = page.url

    def attacker(route: Route) -> None:
        # The signed-in admin's own consent page, with its real headers, served inside an attacker's frame; and,
        # as a control, the same page without its anti-framing headers, which Chromium does render in a frame.
        url = route.request.url
        if url.endswith("/victim") or url.endswith("/control"):
            fetched = route.fetch(url=consent_url)
            headers = dict(fetched.headers)
            if url.endswith("/control"):
                headers = {
                    k: v for k, v in headers.items() if k.lower() not in {"x-frame-options", "content-security-policy"}
                }
            route.fulfill(response=fetched, headers=headers)
        else:
            body = '<iframe id="control" src="/control"></iframe><iframe id="victim" src="/victim"></iframe>'
            route.fulfill(status=200, content_type="text/html", body=body)

    page.route("https://attacker.example/**", attacker)
    page.goto("https://attacker.example/")
    page.frame_locator("#control").locator("#consent-form").wait_for()
    page.wait_for_load_state("load")
    assert page.frame_locator("#victim").locator("#consent-form").count() == 0
    assert page.frame_locator("#victim").locator("#approve").count() == 0
