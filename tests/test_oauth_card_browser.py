"""The OAuth card and the console's home page in headless Chromium: the sign-in reached from an authorization request
names the application and looks like the consent card; the consent card says how long access lasts and "Approve
read-only instead" gives a token that cannot write; no word is broken mid-word on a phone; a client metadata document
that cannot be fetched is explained; with metadata documents off, clients are sent to dynamic registration; the home
page shows the status. Screenshots (home.png, consent-card.png) go to tests.artifacts.artifact_dir()."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from playwright.sync_api import Browser, Page, ViewportSize

from tests.artifacts import artifact_dir
from tests.browser import past_the_second_factor_offer
from tests.live import LiveServer, free_port, mcp_client, running_server
from tests.oauth_flow import AdminSession, Client, authorize_url, exchange, pkce, query_of, register, shell

pytestmark = [pytest.mark.live, pytest.mark.browser]
CALLBACK = "https://claude.ai/api/mcp/auth_callback"
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 740}
# A long name of ordinary words, which a phone must wrap between words only.
LONG_NAME = "Claude Desktop for the infrastructure operations team"

# The words of the element's text (runs without spaces) that a line break splits between two letters or digits
# although the word, set on a line of its own, would fit the element: words broken inside. Characters are measured
# with a Range each (their line is the top of their box).
MID_WORD_BREAKS = """
(element) => {
  const width = element.getBoundingClientRect().width;
  const probe = document.createElement('span');
  probe.style.whiteSpace = 'nowrap';
  probe.style.position = 'absolute';
  probe.style.visibility = 'hidden';
  const broken = [];
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent;
    const pattern = /\\S+/g;
    for (let match = pattern.exec(text); match; match = pattern.exec(text)) {
      // A line break between two letters or digits (a break after "/" or "-" is the line breaker's own choice).
      let inside = false, previousTop = null;
      for (let index = match.index; index < match.index + match[0].length; index++) {
        const range = document.createRange();
        range.setStart(node, index);
        range.setEnd(node, index + 1);
        const box = range.getBoundingClientRect();
        if (box.width === 0) continue;
        const top = Math.round(box.top);
        if (previousTop !== null && top > previousTop && /\\w/.test(text[index - 1]) && /\\w/.test(text[index])) {
          inside = true;
        }
        previousTop = top;
      }
      if (!inside) continue;
      probe.textContent = match[0];
      node.parentElement.appendChild(probe);
      const wordWidth = probe.getBoundingClientRect().width;
      probe.remove();
      if (wordWidth <= width) broken.push(match[0]);
    }
  }
  return broken;
}
"""


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


def new_page(browser: Browser, viewport: ViewportSize) -> Page:
    page = browser.new_context(viewport=viewport).new_page()
    page.route("https://claude.ai/**", lambda route: route.fulfill(status=200, body="callback reached"))
    return page


@pytest.fixture
def desktop(browser: Browser) -> Iterator[Page]:
    page = new_page(browser, DESKTOP)
    yield page
    page.context.close()


@pytest.fixture
def phone(browser: Browser) -> Iterator[Page]:
    page = new_page(browser, PHONE)
    yield page
    page.context.close()


def card_look(page: Page) -> dict[str, str]:
    return dict(
        page.eval_on_selector(
            "main.card",
            """(card) => { const s = getComputedStyle(card), b = getComputedStyle(document.body);
                 return {card: s.backgroundColor, radius: s.borderRadius, width: s.maxWidth, page: b.backgroundColor,
                         font: b.fontFamily}; }""",
        )
    )


def sign_in(page: Page, server: LiveServer) -> None:
    page.fill("#id_username", "admin")
    page.fill("#id_password", server.admin_password)
    page.click("input[type=submit]")
    past_the_second_factor_offer(page, server)


def call_in_thread(function: Any) -> Any:
    """Run an async function to its end in a thread of its own (Playwright's sync API holds this one's loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, function).result(timeout=120)


def test_sign_in_names_the_app_like_the_consent_card_and_read_only_gives_a_token_that_cannot_write(
    desktop: Page, server: LiveServer
) -> None:
    page = desktop
    client = register(server, CALLBACK, client_name="Claude")
    verifier, challenge = pkce()
    page.goto(authorize_url(server, client, challenge, state="card-state"))
    assert page.url.startswith(f"{server.url}/admin/login/?next=/oauth/authorize/")
    assert page.is_visible("#sign-in-card")
    assert page.inner_text("#client-name") == "Claude" and page.inner_text("#redirect-host") == "claude.ai"
    sign_in_look = card_look(page)

    sign_in(page, server)
    page.wait_for_selector("#consent-form")
    assert card_look(page) == sign_in_look, "the sign-in and the consent card look alike"
    lifetime = page.inner_text("#lifetime")
    assert "1 hour at a time" in lifetime and "30 days without use" in lifetime
    page.screenshot(path=str(artifact_dir() / "consent-card.png"), full_page=True)

    with page.expect_request(lambda request: request.url.startswith(CALLBACK)) as reached:
        page.click("#approve-read-only")
    answer = query_of(reached.value.url)
    assert answer["state"] == "card-state" and answer["iss"] == server.url
    tokens = exchange(server, client, answer["code"], verifier)
    assert tokens.status_code == 200 and tokens.json()["scope"] == "mcp:read"

    async def use() -> tuple[set[str], str]:
        async with mcp_client(server.mcp_url, str(tokens.json()["access_token"])) as mcp:
            names = {tool.name for tool in (await mcp.list_tools()).tools}
            try:
                await mcp.call_tool("file_write", {"path": "card-read-only.txt", "content": "no"})
            except MCPError as refused:  # the 403 insufficient_scope a client that does not step up hands on
                return names, str(refused)
            return names, "written"

    names, written = call_in_thread(use)
    assert "file_read" in names and "terminal_exec" not in names and "file_write" not in names
    assert "does not allow file_write" in written
    assert not (server.workspace / "card-read-only.txt").exists()


def test_no_word_is_broken_inside_on_a_phone(phone: Page, server: LiveServer) -> None:
    page = phone
    client = register(server, CALLBACK, client_name=LONG_NAME)
    page.goto(authorize_url(server, client, pkce()[1]))
    page.wait_for_selector("#sign-in-card")
    assert page.eval_on_selector("main", "(card) => card.scrollWidth <= window.innerWidth")
    assert page.eval_on_selector("main", MID_WORD_BREAKS) == []
    sign_in(page, server)
    page.wait_for_selector("#consent-form")
    # The card's text wraps (several lines at 375 px), between words only; the client ID, one long run, may break.
    assert page.eval_on_selector("#client-name", "(e) => e.getClientRects().length") > 1
    assert page.eval_on_selector("main", MID_WORD_BREAKS) == []
    assert page.eval_on_selector("main", "(card) => card.scrollWidth <= window.innerWidth")
    style = page.eval_on_selector("body", "(b) => [getComputedStyle(b).overflowWrap, getComputedStyle(b).hyphens]")
    assert style == ["break-word", "manual"]


def test_a_metadata_document_that_cannot_be_fetched_is_explained(desktop: Page, server: LiveServer) -> None:
    # The fetcher refuses private addresses before it connects: a failure that needs no network to build.
    client_id = f"https://127.0.0.1:{free_port()}/oauth/client-metadata.json"
    page = desktop
    page.goto(authorize_url(server, Client(client_id, None, CALLBACK), pkce()[1]))
    assert page.inner_text("#metadata-host") == "127.0.0.1"
    sign_in(page, server)
    page.wait_for_selector("#error-card")
    assert page.inner_text("#error-description") == "Invalid client_id parameter value."
    assert page.inner_text("#what-failed") == (
        f"Could not fetch {client_id}: its host resolves to a private or loopback address, which this server never "
        "fetches from."
    )
    assert "non-public address (127.0.0.1)" in page.inner_text("#failure-reason")
    assert "SANDSTORM_CLIENT_METADATA_DOCUMENTS=0" in page.inner_text("#what-to-do")


def test_with_metadata_documents_off_clients_are_sent_to_dynamic_registration(tmp_path: Path) -> None:
    with running_server(tmp_path, SANDSTORM_CLIENT_METADATA_DOCUMENTS="0") as server:
        metadata = httpx2.get(f"{server.url}/.well-known/oauth-authorization-server", timeout=30).json()
        assert metadata.get("client_id_metadata_document_supported") is not True
        assert metadata["registration_endpoint"] == f"{server.url}/oauth/register/"
        admin = AdminSession(server)
        try:
            client_id = "https://claude.ai/oauth/claude-code-client-metadata"
            page = admin.consent_page(authorize_url(server, Client(client_id, None, CALLBACK), pkce()[1]))
        finally:
            admin.close()
        assert page.status_code == 400
        assert "SANDSTORM_CLIENT_METADATA_DOCUMENTS is off" in page.text and "must register dynamically" in page.text


SEED = """
import json, os, socket
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from audit.log import Actor, call_finished, call_started
from audit.models import ServerInstance
from oauth.models import BearerToken, Revocation, new_token_secret
server = ServerInstance.objects.filter(stopped_at__isnull=True, pid={pid}).get()
who = Actor(user_id=1, username="admin", credential_kind="bearer", credential_id="4242", credential_name="home-laptop")
running = call_started(who, "terminal_exec", {{"command": "make home-page-test"}}, server.pk)
for outcome in ("error", "error", "timeout", "denied"):
    call_finished(call_started(who, "terminal_exec", {{"command": "false"}}, server.pk), outcome, duration_ms=3)
token = BearerToken(name="home-expiring", user=get_user_model().objects.get(username="admin"),
                    expires_at=timezone.now() + timedelta(days=3))
token.set_secret(new_token_secret())
token.save()
Revocation.objects.create(reason=Revocation.REASON_ROTATION, username="home-rotator")
print(json.dumps({{"running": running.pk, "token": token.pk}}))
"""


def test_the_home_page_shows_the_status(admin_page: Page, live_server: LiveServer) -> None:
    assert live_server.process is not None
    seeded = json.loads(shell(live_server, SEED.format(pid=live_server.process.pid)).strip().splitlines()[-1])
    page = admin_page
    page.set_viewport_size(DESKTOP)
    page.goto(f"{live_server.url}/admin/")
    executor = page.inner_text("#status-executor")
    assert "up" in executor and getpass.getuser() in page.inner_text("#executor-user")
    running = page.locator("#running-calls a", has_text="terminal_exec").first
    assert running.get_attribute("href") == f"/admin/audit/auditrecord/{seeded['running']}/change/"
    assert "home-laptop" in page.inner_text("#connected-clients")
    expiring = page.locator("#expiring-credentials a", has_text="home-expiring")
    assert expiring.get_attribute("href") == f"/admin/oauth/bearertoken/{seeded['token']}/change/"
    # At least the seeded ones: other tests share this server.
    counts = {
        outcome: int(page.inner_text(f"#failures tr.outcome-{outcome} td"))
        for outcome in ("error", "timeout", "denied")
    }
    assert counts["error"] >= 2 and counts["timeout"] >= 1 and counts["denied"] >= 1
    assert "home-rotator" in page.inner_text("#last-rotation")
    for task in ("#task-tokens", "#task-new-token", "#task-apps", "#task-audit", "#task-events", "#task-rotate"):
        assert page.is_visible(task), task
    assert page.is_visible("#all-models") and page.is_visible("#content-main .app-oauth")
    page.screenshot(path=str(artifact_dir() / "home.png"), full_page=True)

    page.locator("#failures tr.outcome-error a").click()
    page.wait_for_url("**/admin/audit/auditrecord/?outcome=error*")
    assert page.locator("#result_list tbody tr").count() >= 2
