"""The authorization and token endpoints: discovery, redirect URIs, PKCE, codes, resources, refresh-token rotation,
and the consent page's protections. In-process, with Django's test client at this process's public URL (settings);
whether /mcp takes a token, the server's own authenticator says. (End to end over real HTTP, through /mcp:
tests/test_oauth_e2e_live.py and tests/test_oauth_mcp_live.py.)"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from oauth2_provider.models import Grant

from oauth.credentials import build_authenticator
from tests.oauth_flow import (
    HERE,
    AdminHere,
    Client,
    audit_events_here,
    authorize_url,
    exchange_here,
    hidden_inputs,
    obtain_tokens_here,
    pkce,
    post_form,
    query_of,
    refresh_here,
    register_here,
    web_client,
)

pytestmark = pytest.mark.django_db
APP_REDIRECT = "https://app.example/cb"


@pytest.fixture
def admin(db: None) -> AdminHere:
    return AdminHere()


@pytest.fixture
def registered(db: None) -> Client:
    return register_here()


def accepted_at_mcp(raw: str) -> bool:
    """Whether /mcp lets this token in (else 401): the authenticator the server builds for it decides, on this
    thread (its blocking lookup, which is what it answers for an OAuth token)."""
    authenticator = build_authenticator(steady=False)
    try:
        return authenticator.principal_for(raw, client_address="127.0.0.1", user_agent="") is not None
    finally:
        authenticator.close()


def consents_of(client: Client) -> list[dict[str, Any]]:
    return [e for e in audit_events_here("oauth.consent") if e["detail"]["client_id"] == client.client_id]


def test_metadata_advertises_only_what_the_server_accepts() -> None:
    metadata = web_client().get("/.well-known/oauth-authorization-server").json()
    assert metadata["issuer"] == HERE.url
    assert metadata["response_types_supported"] == ["code"]
    assert metadata["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert {"none", "client_secret_post"} <= set(metadata["token_endpoint_auth_methods_supported"])
    assert metadata["scopes_supported"] == ["mcp", "mcp:read"]
    assert metadata["revocation_endpoint"] == f"{HERE.url}/oauth/revoke/"
    assert metadata["registration_endpoint"] == f"{HERE.url}/oauth/register/"
    assert metadata["client_id_metadata_document_supported"] is True
    assert metadata["authorization_response_iss_parameter_supported"] is True
    assert "introspection_endpoint" not in metadata


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"])
def test_protected_resource_metadata_names_our_resource_and_issuer(path: str) -> None:
    document = web_client().get(path).json()
    assert document["resource"] == HERE.mcp_url
    assert document["authorization_servers"] == [HERE.url]
    assert document["scopes_supported"] == ["mcp", "mcp:read"]


@pytest.mark.parametrize(
    "path",
    [
        "/oauth/introspect/",
        "/oauth/device-authorization/",
        "/oauth/applications/",
        "/.well-known/openid-configuration",
        "/oauth/userinfo/",
    ],
)
def test_toolkit_endpoints_we_do_not_use_are_not_mounted(path: str) -> None:
    assert web_client().get(path).status_code == 404


def test_iss_in_the_authorization_response_equals_the_metadata_issuer(admin: AdminHere, registered: Client) -> None:
    issuer = web_client().get("/.well-known/oauth-authorization-server").json()["issuer"]
    _, challenge = pkce()
    location = admin.decide(authorize_url(HERE, registered, challenge, state="s-iss"))
    answer = query_of(location)
    assert location.startswith(registered.redirect_uri + "?")
    assert answer["iss"] == issuer == HERE.url
    assert answer["state"] == "s-iss" and answer["code"]


def test_deny_redirects_with_access_denied_state_and_iss(admin: AdminHere, registered: Client) -> None:
    _, challenge = pkce()
    answer = query_of(admin.decide(authorize_url(HERE, registered, challenge, state="s-deny"), approve=False))
    assert answer["error"] == "access_denied" and answer["state"] == "s-deny" and answer["iss"] == HERE.url
    assert "code" not in answer
    [consent] = consents_of(registered)
    assert consent["username"] == "admin" and consent["detail"]["decision"] == "denied"
    assert consent["detail"]["scope"] == "mcp" and consent["detail"]["redirect_host"] == "127.0.0.1:33418"


def test_approvals_are_recorded_in_the_audit_log(admin: AdminHere, registered: Client) -> None:
    obtain_tokens_here(admin, registered)
    [consent] = consents_of(registered)
    assert consent["detail"]["decision"] == "approved" and consent["detail"]["outcome"] == "code issued"


def test_without_a_signed_in_staff_user_authorize_sends_to_the_admin_login(registered: Client) -> None:
    _, challenge = pkce()
    response = web_client().get(authorize_url(HERE, registered, challenge))
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/oauth/authorize/")


@pytest.mark.parametrize(
    ("requested", "why"),
    [
        ("https://app.example/cb2", "path"),
        ("https://app.example/cb?next=evil", "query"),
        ("http://app.example/cb", "scheme"),
        ("https://attacker@app.example/cb", "userinfo"),
        ("https://app.example:8443/cb", "port"),
        ("https://evil.example/cb", "host"),
    ],
)
def test_a_redirect_uri_that_differs_is_refused_without_redirecting(admin: AdminHere, requested: str, why: str) -> None:
    registered = register_here(APP_REDIRECT)
    _, challenge = pkce()
    url = authorize_url(HERE, Client(registered.client_id, None, requested), challenge)
    response = admin.consent_page(url)
    assert response.status_code == 400, why
    assert "Location" not in response
    assert b"refused" in response.content


@pytest.mark.parametrize(
    "uri", ["http://127.0.0.1:33418/callback", "http://localhost:33418/callback", "http://[::1]:33418/callback"]
)
def test_a_loopback_redirect_matches_on_any_port(admin: AdminHere, uri: str) -> None:
    registered = register_here(uri)
    _, challenge = pkce()
    other_port = uri.replace("33418", "51234")
    page = admin.consent_page(authorize_url(HERE, Client(registered.client_id, None, other_port), challenge))
    assert page.status_code == 200 and b'id="consent-form"' in page.content


def test_plain_pkce_is_refused_before_consent(admin: AdminHere, registered: Client) -> None:
    verifier, _ = pkce()
    url = authorize_url(HERE, registered, None, code_challenge=verifier, code_challenge_method="plain")
    response = admin.consent_page(url)
    assert response.status_code == 302
    answer = query_of(response["Location"])
    assert answer["error"] == "invalid_request" and "code" not in answer


def test_a_missing_code_challenge_is_refused(admin: AdminHere, registered: Client) -> None:
    response = admin.consent_page(authorize_url(HERE, registered, None))
    assert response.status_code == 302
    assert query_of(response["Location"])["error"] == "invalid_request"


def test_a_wrong_or_missing_code_verifier_is_refused(admin: AdminHere, registered: Client) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(HERE, registered, challenge)))["code"]
    wrong = exchange_here(registered, code, pkce()[0])
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    code = query_of(admin.decide(authorize_url(HERE, registered, challenge)))["code"]
    missing = exchange_here(registered, code, None)
    assert missing.status_code == 400 and missing.json()["error"] == "invalid_request"


def test_a_replayed_code_is_refused_and_the_tokens_it_produced_are_revoked(
    admin: AdminHere, registered: Client
) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(HERE, registered, challenge)))["code"]
    first = exchange_here(registered, code, verifier)
    assert first.status_code == 200
    tokens = first.json()
    assert accepted_at_mcp(tokens["access_token"])
    replay = exchange_here(registered, code, verifier)
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert not accepted_at_mcp(tokens["access_token"])
    assert refresh_here(registered, tokens["refresh_token"]).status_code == 400


def test_an_expired_code_is_refused(admin: AdminHere, registered: Client) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(HERE, registered, challenge)))["code"]
    assert Grant.objects.filter(code=code).update(expires=timezone.now() - timedelta(seconds=1)) == 1
    assert exchange_here(registered, code, verifier).json()["error"] == "invalid_grant"


def test_a_request_for_another_resource_gets_invalid_target(admin: AdminHere, registered: Client) -> None:
    verifier, challenge = pkce()
    response = admin.consent_page(authorize_url(HERE, registered, challenge, resource="https://other.example/mcp"))
    assert response.status_code == 302 and query_of(response["Location"])["error"] == "invalid_target"
    code = query_of(admin.decide(authorize_url(HERE, registered, challenge)))["code"]
    token = exchange_here(registered, code, verifier, resource="https://other.example/mcp")
    # The body is JSON though the toolkit labels this answer text/html, which the test client's json() refuses.
    assert token.status_code == 400 and json.loads(token.content)["error"] == "invalid_target"


def test_a_request_without_resource_gets_a_token_for_ours(admin: AdminHere, registered: Client) -> None:
    verifier, challenge = pkce()
    location = admin.decide(authorize_url(HERE, registered, challenge, resource=None))
    token = exchange_here(registered, query_of(location)["code"], verifier)
    assert token.status_code == 200
    assert accepted_at_mcp(token.json()["access_token"])


def test_refresh_tokens_rotate_and_a_reused_one_revokes_its_family(admin: AdminHere, registered: Client) -> None:
    first = obtain_tokens_here(admin, registered)
    second = refresh_here(registered, str(first["refresh_token"]))
    assert second.status_code == 200
    rotated = second.json()
    assert rotated["refresh_token"] != first["refresh_token"]
    assert accepted_at_mcp(rotated["access_token"])
    reuse = refresh_here(registered, str(first["refresh_token"]))
    assert reuse.status_code == 400 and reuse.json()["error"] == "invalid_grant"
    assert not accepted_at_mcp(rotated["access_token"])
    assert refresh_here(registered, rotated["refresh_token"]).status_code == 400


def test_approval_prompt_auto_still_shows_the_consent_page(admin: AdminHere, registered: Client) -> None:
    obtain_tokens_here(admin, registered)  # an earlier approval, with a live token
    _, challenge = pkce()
    page = admin.consent_page(authorize_url(HERE, registered, challenge, approval_prompt="auto"))
    assert page.status_code == 200 and b'id="consent-form"' in page.content


def test_a_consent_post_without_csrf_token_is_refused(admin: AdminHere, registered: Client) -> None:
    _, challenge = pkce()
    url = authorize_url(HERE, registered, challenge)
    form = hidden_inputs(admin.consent_page(url).content.decode(), "consent-form")
    form.pop("csrfmiddlewaretoken")
    response = post_form(admin.http, url, {**form, "allow": "Authorize"}, HTTP_REFERER=url)
    assert response.status_code == 403
    assert "Location" not in response


def test_the_consent_page_cannot_be_framed_and_has_a_strict_csp(admin: AdminHere, registered: Client) -> None:
    _, challenge = pkce()
    page = admin.consent_page(authorize_url(HERE, registered, challenge))
    assert page["X-Frame-Options"] == "DENY"
    csp = page["Content-Security-Policy"]
    for directive in (
        "default-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self' http://127.0.0.1:33418",
    ):
        assert directive in csp
    assert "unsafe-inline" not in csp and "script-src" not in csp
    assert page["Cache-Control"] == "no-store"
