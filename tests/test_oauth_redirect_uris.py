"""One parser decides what a redirect URI's host is (oauth/authority.py, through oauth/redirects.py), and registration
and authorization both use it: a table of hostile URIs, each refused by /oauth/register/ and, for a client that
holds it anyway (registered by hand), by /oauth/authorize/ too. In-process, with the test client."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from oauth2_provider.models import Application

from oauth.redirects import is_loopback, redirect_host, redirect_uri_refusal
from tests.oauth_flow import pkce

pytestmark = pytest.mark.django_db

HOSTILE = [
    "http://[::1].evil.example/cb",  # urlsplit's hostname: "::1"
    "http://[::1]evil.example/cb",
    "http://127.0.0.1.evil.example/cb",
    "http://localhost.evil.example/cb",
    "http://localhost@evil.example/cb",
    "http://evil.example@localhost/cb",
    "http://user:pass@127.0.0.1/cb",
    "http://localhost:80@evil.example/cb",
    "http://0x7f.0.0.1/cb",
    "http://0x7f000001/cb",
    "http://2130706433/cb",
    "http://127.1/cb",
    "http://0177.0.0.1/cb",
    "http://127.000.000.001/cb",
    "http://[0:0:0:0:0:0:0:1]/cb",
    "http://[::ffff:127.0.0.1]/cb",
    "http://[::1%25eth0]/cb",
    "http://[fe80::1%25lo]:8080/cb",
    "http://localhost./cb",
    "http://127.0.0.1./cb",
    "http://local\thost/cb",
    "http://localhost\\@evil.example/cb",
    "http://localhost:/cb",
    "http://localhost:0/cb",
    "http://localhost:65536/cb",
    "http://localhost:8o8o/cb",
    "http://%6c%6f%63%61%6c%68%6f%73%74/cb",
    "http://ｌｏｃａｌｈｏｓｔ/cb",
    "http://127.0.0.2/cb",
    "https://[::1].evil.example/cb",
    "https://evil.example./cb",
    "https://evil..example/cb",
    "https://ev il.example/cb",
    "https://1.2.3/cb",
    "https://claude.ai/cb#fragment",
    "javascript://localhost/%0aalert(1)",
    "http:/localhost/cb",
    "http:localhost/cb",
]
ALLOWED = [
    ("https://claude.ai/api/mcp/auth_callback", False, "claude.ai"),
    ("https://claude.ai:8443/cb?x=1", False, "claude.ai"),
    ("https://203.0.113.9/cb", False, "203.0.113.9"),
    ("https://[2001:db8::1]/cb", False, "[2001:db8::1]"),
    ("http://127.0.0.1:33418/callback", True, "127.0.0.1:33418"),
    ("http://localhost/callback", True, "localhost"),
    ("http://LOCALHOST:9/cb", True, "localhost:9"),
    ("http://[::1]:5000/cb", True, "[::1]:5000"),
]


@pytest.mark.parametrize("uri", HOSTILE)
def test_a_hostile_redirect_uri_is_not_taken_for_loopback_nor_allowed(uri: str) -> None:
    assert redirect_uri_refusal(uri) is not None
    assert not is_loopback(uri)


@pytest.mark.parametrize(("uri", "loopback", "host"), ALLOWED)
def test_https_and_plain_loopback_redirect_uris_are_allowed(uri: str, loopback: bool, host: str) -> None:
    assert redirect_uri_refusal(uri) is None
    assert is_loopback(uri) is loopback
    assert redirect_host(uri) == host


@pytest.mark.parametrize("uri", HOSTILE)
def test_registration_refuses_a_hostile_redirect_uri_with_invalid_redirect_uri(uri: str) -> None:
    body = json.dumps({"redirect_uris": [uri], "token_endpoint_auth_method": "none"})
    response = Client().post("/oauth/register/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_redirect_uri"
    assert not Application.objects.exists()


@pytest.fixture
def staff_browser() -> Client:
    user = get_user_model().objects.create_user("approver", password="x", is_staff=True)
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.mark.parametrize("uri", HOSTILE)
def test_authorization_refuses_a_hostile_redirect_uri_held_by_a_client(uri: str, staff_browser: Client) -> None:
    application = Application(
        name="by hand",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris=uri,
        skip_authorization=False,
    )
    application.save()  # not full_clean(): as a client added by hand or from an old registration could be
    _, challenge = pkce()
    query = {"response_type": "code", "client_id": application.client_id, "redirect_uri": uri, "scope": "mcp",
             "state": "s", "code_challenge": challenge, "code_challenge_method": "S256"}  # fmt: skip
    response = staff_browser.get(f"/oauth/authorize/?{urlencode(query)}")
    assert response.status_code == 400, response.content[:300]
    assert b"Approve" not in response.content and "Location" not in response


@pytest.mark.parametrize(("uri", "loopback", "host"), ALLOWED[:1] + ALLOWED[4:5])
def test_authorization_shows_the_consent_page_for_an_allowed_redirect_uri(
    uri: str, loopback: bool, host: str, staff_browser: Client
) -> None:
    application = Application.objects.create(
        name="fine", client_type="public", authorization_grant_type="authorization-code", redirect_uris=uri
    )
    _, challenge = pkce()
    query = {"response_type": "code", "client_id": application.client_id, "redirect_uri": uri, "scope": "mcp",
             "state": "s", "code_challenge": challenge, "code_challenge_method": "S256"}  # fmt: skip
    response = staff_browser.get(f"/oauth/authorize/?{urlencode(query)}")
    assert response.status_code == 200 and b"Approve" in response.content
    assert host.encode() in response.content
