"""The authorization and token endpoints over real HTTP: discovery, redirect URIs, PKCE, codes, resources,
refresh-token rotation, and the consent page's protections."""

from __future__ import annotations

import httpx2
import pytest

from tests.live import LiveServer
from tests.oauth_flow import (
    AdminSession,
    Client,
    audit_events,
    authorize_url,
    exchange,
    hidden_inputs,
    mcp_status,
    obtain_tokens,
    pkce,
    query_of,
    refresh,
    register,
    shell,
)

pytestmark = [pytest.mark.live]
APP_REDIRECT = "https://app.example/cb"


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


@pytest.fixture
def client(server: LiveServer) -> Client:
    return register(server)


def test_metadata_advertises_only_what_the_server_accepts(server: LiveServer) -> None:
    metadata = httpx2.get(f"{server.url}/.well-known/oauth-authorization-server", timeout=10).json()
    assert metadata["issuer"] == server.url
    assert metadata["response_types_supported"] == ["code"]
    assert metadata["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert {"none", "client_secret_post"} <= set(metadata["token_endpoint_auth_methods_supported"])
    assert metadata["scopes_supported"] == ["mcp", "mcp:read"]
    assert metadata["revocation_endpoint"] == f"{server.url}/oauth/revoke/"
    assert metadata["registration_endpoint"] == f"{server.url}/oauth/register/"
    assert metadata["client_id_metadata_document_supported"] is True
    assert metadata["authorization_response_iss_parameter_supported"] is True
    assert "introspection_endpoint" not in metadata


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"])
def test_protected_resource_metadata_names_our_resource_and_issuer(server: LiveServer, path: str) -> None:
    document = httpx2.get(f"{server.url}{path}", timeout=10).json()
    assert document["resource"] == server.mcp_url
    assert document["authorization_servers"] == [server.url]
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
def test_toolkit_endpoints_we_do_not_use_are_not_mounted(server: LiveServer, path: str) -> None:
    assert httpx2.get(f"{server.url}{path}", timeout=10).status_code == 404


def test_iss_in_the_authorization_response_equals_the_metadata_issuer(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    issuer = httpx2.get(f"{server.url}/.well-known/oauth-authorization-server", timeout=10).json()["issuer"]
    _, challenge = pkce()
    location = admin.decide(authorize_url(server, client, challenge, state="s-iss"))
    answer = query_of(location)
    assert location.startswith(client.redirect_uri + "?")
    assert answer["iss"] == issuer == server.url
    assert answer["state"] == "s-iss" and answer["code"]


def test_deny_redirects_with_access_denied_state_and_iss(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    _, challenge = pkce()
    answer = query_of(admin.decide(authorize_url(server, client, challenge, state="s-deny"), approve=False))
    assert answer["error"] == "access_denied" and answer["state"] == "s-deny" and answer["iss"] == server.url
    assert "code" not in answer
    [consent] = [e for e in audit_events(server, "oauth.consent") if e["detail"]["client_id"] == client.client_id]
    assert consent["username"] == "admin" and consent["detail"]["decision"] == "denied"
    assert consent["detail"]["scope"] == "mcp" and consent["detail"]["redirect_host"] == "127.0.0.1:33418"


def test_approvals_are_recorded_in_the_audit_log(server: LiveServer, admin: AdminSession, client: Client) -> None:
    obtain_tokens(server, admin, client)
    [consent] = [e for e in audit_events(server, "oauth.consent") if e["detail"]["client_id"] == client.client_id]
    assert consent["detail"]["decision"] == "approved" and consent["detail"]["outcome"] == "code issued"


def test_without_a_signed_in_staff_user_authorize_sends_to_the_admin_login(server: LiveServer, client: Client) -> None:
    _, challenge = pkce()
    response = httpx2.get(authorize_url(server, client, challenge), timeout=10)
    assert response.status_code == 302
    assert response.headers["location"].startswith("/admin/login/?next=/oauth/authorize/")


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
def test_a_redirect_uri_that_differs_is_refused_without_redirecting(
    server: LiveServer, admin: AdminSession, requested: str, why: str
) -> None:
    registered = register(server, APP_REDIRECT)
    _, challenge = pkce()
    url = authorize_url(server, Client(registered.client_id, None, requested), challenge)
    response = admin.consent_page(url)
    assert response.status_code == 400, why
    assert "location" not in response.headers
    assert "refused" in response.text


@pytest.mark.parametrize(
    "registered", ["http://127.0.0.1:33418/callback", "http://localhost:33418/callback", "http://[::1]:33418/callback"]
)
def test_a_loopback_redirect_matches_on_any_port(server: LiveServer, admin: AdminSession, registered: str) -> None:
    client = register(server, registered)
    _, challenge = pkce()
    other_port = registered.replace("33418", "51234")
    page = admin.consent_page(authorize_url(server, Client(client.client_id, None, other_port), challenge))
    assert page.status_code == 200 and 'id="consent-form"' in page.text


def test_plain_pkce_is_refused_before_consent(server: LiveServer, admin: AdminSession, client: Client) -> None:
    verifier, _ = pkce()
    url = authorize_url(server, client, None, code_challenge=verifier, code_challenge_method="plain")
    response = admin.consent_page(url)
    assert response.status_code == 302
    answer = query_of(response.headers["location"])
    assert answer["error"] == "invalid_request" and "code" not in answer


def test_a_missing_code_challenge_is_refused(server: LiveServer, admin: AdminSession, client: Client) -> None:
    response = admin.consent_page(authorize_url(server, client, None))
    assert response.status_code == 302
    assert query_of(response.headers["location"])["error"] == "invalid_request"


def test_a_wrong_or_missing_code_verifier_is_refused(server: LiveServer, admin: AdminSession, client: Client) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(server, client, challenge)))["code"]
    wrong = exchange(server, client, code, pkce()[0])
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    code = query_of(admin.decide(authorize_url(server, client, challenge)))["code"]
    missing = exchange(server, client, code, None)
    assert missing.status_code == 400 and missing.json()["error"] == "invalid_request"


def test_a_replayed_code_is_refused_and_the_tokens_it_produced_are_revoked(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(server, client, challenge)))["code"]
    first = exchange(server, client, code, verifier)
    assert first.status_code == 200
    tokens = first.json()
    assert mcp_status(server, tokens["access_token"]).status_code == 200
    replay = exchange(server, client, code, verifier)
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert mcp_status(server, tokens["access_token"]).status_code == 401
    assert refresh(server, client, tokens["refresh_token"]).status_code == 400


def test_an_expired_code_is_refused(server: LiveServer, admin: AdminSession, client: Client) -> None:
    verifier, challenge = pkce()
    code = query_of(admin.decide(authorize_url(server, client, challenge)))["code"]
    shell(
        server,
        f"from datetime import timedelta; from django.utils import timezone; from oauth2_provider.models import Grant; "
        f"Grant.objects.filter(code={code!r}).update(expires=timezone.now() - timedelta(seconds=1))",
    )
    assert exchange(server, client, code, verifier).json()["error"] == "invalid_grant"


def test_a_request_for_another_resource_gets_invalid_target(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    verifier, challenge = pkce()
    response = admin.consent_page(authorize_url(server, client, challenge, resource="https://other.example/mcp"))
    assert response.status_code == 302 and query_of(response.headers["location"])["error"] == "invalid_target"
    code = query_of(admin.decide(authorize_url(server, client, challenge)))["code"]
    token = exchange(server, client, code, verifier, resource="https://other.example/mcp")
    assert token.status_code == 400 and token.json()["error"] == "invalid_target"


def test_a_request_without_resource_gets_a_token_for_ours(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    verifier, challenge = pkce()
    location = admin.decide(authorize_url(server, client, challenge, resource=None))
    token = exchange(server, client, query_of(location)["code"], verifier)
    assert token.status_code == 200
    assert mcp_status(server, token.json()["access_token"]).status_code == 200


def test_refresh_tokens_rotate_and_a_reused_one_revokes_its_family(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    first = obtain_tokens(server, admin, client)
    second = refresh(server, client, str(first["refresh_token"]))
    assert second.status_code == 200
    rotated = second.json()
    assert rotated["refresh_token"] != first["refresh_token"]
    assert mcp_status(server, rotated["access_token"]).status_code == 200
    reuse = refresh(server, client, str(first["refresh_token"]))
    assert reuse.status_code == 400 and reuse.json()["error"] == "invalid_grant"
    assert mcp_status(server, rotated["access_token"]).status_code == 401
    assert refresh(server, client, rotated["refresh_token"]).status_code == 400


def test_approval_prompt_auto_still_shows_the_consent_page(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    obtain_tokens(server, admin, client)  # an earlier approval, with a live token
    _, challenge = pkce()
    page = admin.consent_page(authorize_url(server, client, challenge, approval_prompt="auto"))
    assert page.status_code == 200 and 'id="consent-form"' in page.text


def test_a_consent_post_without_csrf_token_is_refused(server: LiveServer, admin: AdminSession, client: Client) -> None:
    _, challenge = pkce()
    url = authorize_url(server, client, challenge)
    form = hidden_inputs(admin.consent_page(url).text, "consent-form")
    form.pop("csrfmiddlewaretoken")
    response = admin.http.post(url, data={**form, "allow": "Authorize"}, headers={"Referer": url})
    assert response.status_code == 403
    assert "location" not in response.headers


def test_the_consent_page_cannot_be_framed_and_has_a_strict_csp(
    server: LiveServer, admin: AdminSession, client: Client
) -> None:
    _, challenge = pkce()
    page = admin.consent_page(authorize_url(server, client, challenge))
    assert page.headers["x-frame-options"] == "DENY"
    csp = page.headers["content-security-policy"]
    for directive in (
        "default-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self' http://127.0.0.1:33418",
    ):
        assert directive in csp
    assert "unsafe-inline" not in csp and "script-src" not in csp
    assert page.headers["cache-control"] == "no-store"
