"""The OAuth card in-process (the test client): the sign-in page reached from an authorization request names the
application, the consent card says how long access lasts and offers read-only, and a client metadata document that
could not be fetched is explained. The same in Chromium: tests/test_oauth_card_browser.py."""

from __future__ import annotations

import base64
import hashlib
import html
import re
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from oauth2_provider.cimd import CIMDError
from oauth2_provider.models import AccessToken, Application

from oauth.metadata_documents import ExplainingMetadataFetcher
from tests.oauth_flow import hidden_inputs

pytestmark = pytest.mark.django_db
CALLBACK = "https://claude.ai/api/mcp/auth_callback"


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


def application(name: str = "Claude") -> Application:
    return Application.objects.create(
        name=name, client_type="public", authorization_grant_type="authorization-code", redirect_uris=CALLBACK
    )


def authorize_path(client_id: str, scope: str = "mcp", challenge: str | None = None) -> str:
    query = {"response_type": "code", "client_id": client_id, "redirect_uri": CALLBACK, "scope": scope, "state": "s",
             "code_challenge": challenge or pkce()[1], "code_challenge_method": "S256",
             "resource": settings.MCP_RESOURCE_URL}  # fmt: skip
    return f"/oauth/authorize/?{urlencode(query)}"


@pytest.fixture
def staff() -> Any:
    return get_user_model().objects.create_user("approver", password="approver-password-1", is_staff=True)


@pytest.fixture
def signed_in(staff: Any) -> Iterator[Client]:
    browser = Client()
    browser.force_login(staff)
    yield browser


# --- the sign-in page ------------------------------------------------------------------------------------------


def test_the_sign_in_from_an_authorization_request_names_the_application_in_the_card_look(staff: Any) -> None:
    app = application("Claude <b>")
    browser = Client()
    answer = browser.get(authorize_path(app.client_id))
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/?next=")
    page = browser.get(answer["Location"]).content.decode()
    assert 'id="sign-in-card"' in page and "oauth/consent.css" in page and "admin/css/login.css" not in page
    assert 'id="client-name">Claude &lt;b&gt;</span>' in page and "<b>" not in page
    assert 'id="redirect-host">claude.ai<' in page
    form = hidden_inputs(page, "login-form")
    assert form["next"].startswith("/oauth/authorize/?") and "csrfmiddlewaretoken" in form
    assert 'name="username"' in page and 'name="password"' in page

    signed = browser.post(answer["Location"], {**form, "username": "approver", "password": "approver-password-1"})
    # An approver with no second factor is offered one first; "Not now" goes on to the consent card.
    assert signed.status_code == 302 and signed["Location"].startswith("/admin/second-factor/offer/?next=")
    offer = browser.get(signed["Location"]).content.decode()
    not_now = re.search(r'href="([^"]+)" id="second-factor-not-now"', offer)
    assert not_now is not None and html.unescape(not_now.group(1)) == form["next"]
    assert 'id="consent-card"' in browser.get(form["next"]).content.decode()


def test_a_wrong_password_on_the_card_is_said_on_the_card(staff: Any) -> None:
    app = application()
    browser = Client()
    login = f"/admin/login/?next={quote(authorize_path(app.client_id))}"
    form = hidden_inputs(browser.get(login).content.decode(), "login-form")
    page = browser.post(login, {**form, "username": "approver", "password": "wrong"}).content.decode()
    assert 'id="sign-in-card"' in page and 'role="alert"' in page


def test_a_client_not_registered_yet_is_said_so(db: None) -> None:
    url = "https://claude.ai/oauth/claude-code-client-metadata"
    page = Client().get(f"/admin/login/?next={quote(authorize_path(url))}").content.decode()
    assert 'id="not-registered"' in page and 'id="metadata-host">claude.ai<' in page
    page = Client().get(f"/admin/login/?next={quote(authorize_path('no-such-client'))}").content.decode()
    assert "not registered on this server" in page and "no-such-client" in page


@pytest.mark.parametrize("next_url", ["", "/admin/oauth/bearertoken/", "https://evil.example/oauth/authorize/?x=1"])
def test_any_other_sign_in_is_the_stock_admin_login(db: None, next_url: str) -> None:
    page = Client().get(f"/admin/login/?next={quote(next_url)}" if next_url else "/admin/login/").content.decode()
    assert "admin/css/login.css" in page and 'id="sign-in-card"' not in page and 'id="login-form"' in page


# --- the consent card -------------------------------------------------------------------------------------------


def test_the_consent_card_says_how_long_access_lasts_from_the_toolkit_settings(signed_in: Client) -> None:
    page = signed_in.get(authorize_path(application().client_id)).content.decode()
    assert "Access lasts 1 hour at a time" in page and "after 30 days without use" in page
    provider = {
        **settings.OAUTH2_PROVIDER,
        "ACCESS_TOKEN_EXPIRE_SECONDS": 900,
        "REFRESH_TOKEN_EXPIRE_SECONDS": 7 * 86400,
    }
    with override_settings(OAUTH2_PROVIDER=provider):
        page = signed_in.get(authorize_path(application().client_id)).content.decode()
    assert "Access lasts 15 minutes at a time" in page and "after 7 days without use" in page


def test_read_only_is_offered_only_when_every_tool_was_asked_for(signed_in: Client) -> None:
    client_id = application().client_id
    assert 'id="approve-read-only"' in signed_in.get(authorize_path(client_id, "mcp")).content.decode()
    assert 'id="approve-read-only"' not in signed_in.get(authorize_path(client_id, "mcp:read")).content.decode()


def test_approve_read_only_issues_a_token_of_scope_mcp_read(signed_in: Client) -> None:
    app = application()
    verifier, challenge = pkce()
    path = authorize_path(app.client_id, "mcp", challenge)
    form = hidden_inputs(signed_in.get(path).content.decode(), "consent-form")
    assert form["scope"] == "mcp"
    answer = signed_in.post(path, {**form, "read_only": "1"})
    assert answer.status_code == 302
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": app.client_id,
                "code_verifier": verifier}  # fmt: skip
    token = Client().post("/oauth/token/", exchange)
    assert token.status_code == 200, token.content
    assert token.json()["scope"] == "mcp:read"
    assert list(AccessToken.objects.filter(application=app).values_list("scope", flat=True)) == ["mcp:read"]


# --- client metadata documents ------------------------------------------------------------------------------------


class NotFound:
    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        raise CIMDError("client_id document returned HTTP 404")


class NoDns:
    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        raise CIMDError("could not resolve client_id host: [Errno -3] Temporary failure in name resolution")


class WrongId:
    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        return {"client_id": "https://elsewhere.example/doc", "redirect_uris": [CALLBACK]}, 300


class Explaining404(ExplainingMetadataFetcher):
    base = NotFound


class ExplainingNoDns(ExplainingMetadataFetcher):
    base = NoDns


class ExplainingWrongId(ExplainingMetadataFetcher):
    base = WrongId


@pytest.mark.parametrize(
    ("fetcher", "what_failed", "cause"),
    [
        ("Explaining404", "Could not fetch {url}: the server there did not return the document", "HTTP 404"),
        ("ExplainingNoDns", "Could not fetch {url}: its host name could not be resolved (DNS)", "name resolution"),
        ("ExplainingWrongId", "Fetched {url}, but it is not a valid client", "client_id is not the URL it was fetched"),
    ],
)
def test_a_metadata_document_that_could_not_be_fetched_is_explained(
    signed_in: Client, fetcher: str, what_failed: str, cause: str
) -> None:
    url = f"https://client.example/{secrets.token_hex(6)}/metadata.json"
    provider = {**settings.OAUTH2_PROVIDER, "CIMD_METADATA_FETCHER": f"tests.test_oauth_card.{fetcher}"}
    with override_settings(OAUTH2_PROVIDER=provider):
        for attempt in ("fetched", "in the toolkit's backoff, not fetched again"):
            page = signed_in.get(authorize_path(url))
            text = page.content.decode()
            assert page.status_code == 400, attempt
            assert what_failed.format(url=url) in text, attempt
            assert cause in text and "SANDSTORM_CLIENT_METADATA_DOCUMENTS=0" in text, attempt
    if fetcher != "ExplainingWrongId":
        assert "Allow outbound HTTPS (port 443) from this server to client.example" in text


def test_with_metadata_documents_off_a_url_client_id_is_told_to_register_dynamically(signed_in: Client) -> None:
    url = f"https://client.example/{secrets.token_hex(6)}/metadata.json"
    with override_settings(OAUTH2_PROVIDER={**settings.OAUTH2_PROVIDER, "CIMD_ENABLED": False}):
        page = signed_in.get(authorize_path(url))
        metadata = Client().get("/.well-known/oauth-authorization-server").json()
    text = page.content.decode()
    assert page.status_code == 400 and "SANDSTORM_CLIENT_METADATA_DOCUMENTS is off" in text
    assert "must register dynamically" in text and "/oauth/register/" in text
    assert metadata.get("client_id_metadata_document_supported") is not True
