"""Dynamic client registration and client ID metadata documents: open, but only for what an MCP client needs.
In-process, with Django's test client at this process's public URL (settings). (A registration over real HTTP, by
the official SDK: tests/test_oauth_e2e_live.py.)"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from django.test import Client as DjangoClient
from oauth2_provider.models import Application

from tests.oauth_flow import (
    HERE,
    AdminHere,
    Client,
    audit_events_here,
    authorize_url,
    pkce,
    post_form,
    register_here,
    web_client,
)

pytestmark = pytest.mark.django_db
CLAUDE_CALLBACKS = ["https://claude.ai/api/mcp/auth_callback", "https://claude.com/api/mcp/auth_callback"]


def post_registration(http: DjangoClient | None = None, **metadata: object) -> Any:
    body = {"client_name": "probe", "redirect_uris": CLAUDE_CALLBACKS[:1], **metadata}
    return (http or web_client()).post("/oauth/register/", json.dumps(body), content_type="application/json")


def test_claude_ai_registers_anonymously_with_client_secret_post() -> None:
    response = post_registration(
        client_name="Claude",
        redirect_uris=CLAUDE_CALLBACKS,
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="client_secret_post",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["client_secret"] and body["token_endpoint_auth_method"] == "client_secret_post"
    assert body["redirect_uris"] == CLAUDE_CALLBACKS
    assert set(body["grant_types"]) == {"authorization_code", "refresh_token"}
    assert response["Cache-Control"] == "no-store"


def test_a_public_client_registers_with_auth_method_none() -> None:
    response = post_registration(redirect_uris=["http://localhost:8976/callback"], token_endpoint_auth_method="none")
    assert response.status_code == 201
    assert "client_secret" not in response.json() and response.json()["token_endpoint_auth_method"] == "none"


@pytest.mark.parametrize(
    "grant_types",
    [
        ["client_credentials"],
        ["password"],
        ["implicit"],
        ["authorization_code", "client_credentials"],
        ["refresh_token"],
        ["urn:ietf:params:oauth:grant-type:device_code"],
    ],
)
def test_grant_types_other_than_authorization_code_and_refresh_token_are_refused(grant_types: list[str]) -> None:
    response = post_registration(grant_types=grant_types)
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_metadata"
    assert not Application.objects.exists()


def test_a_client_credentials_token_cannot_be_had_even_by_asking_the_token_endpoint() -> None:
    client = register_here(CLAUDE_CALLBACKS[0])
    response = post_form(
        web_client(), "/oauth/token/", {"grant_type": "client_credentials", "scope": "mcp", **client.credentials()}
    )
    assert response.status_code == 400 and response.json()["error"] in {"unauthorized_client", "unsupported_grant_type"}


@pytest.mark.parametrize(
    "uri",
    [
        "http://app.example/cb",
        "ftp://app.example/cb",
        "https://user@app.example/cb",
        "https://app.example/cb#frag",
        "javascript:alert(1)",
    ],
)
def test_redirect_uris_must_be_https_or_loopback(uri: str) -> None:
    response = post_registration(redirect_uris=[uri])
    assert response.status_code == 400 and response.json()["error"] == "invalid_redirect_uri"
    assert not Application.objects.exists()


def test_unknown_token_endpoint_auth_methods_and_response_types_are_refused() -> None:
    assert post_registration(token_endpoint_auth_method="private_key_jwt").status_code == 400
    assert post_registration(response_types=["token"]).status_code == 400
    assert not Application.objects.exists()


def test_a_registered_client_cannot_widen_its_grant_types_through_rfc_7592() -> None:
    client = register_here(CLAUDE_CALLBACKS[0])
    registration = client.registration
    body = {"redirect_uris": CLAUDE_CALLBACKS, "grant_types": ["client_credentials"]}
    response = web_client().put(
        str(registration["registration_client_uri"]),
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {registration['registration_access_token']}",
    )
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_metadata"
    application = Application.objects.get(client_id=client.client_id)
    assert application.authorization_grant_type == Application.GRANT_AUTHORIZATION_CODE


def test_registrations_are_recorded_in_the_audit_log() -> None:
    # From an address other than the test client's default (127.0.0.1): the record must hold the request's.
    http = web_client(REMOTE_ADDR="198.51.100.23")
    response = post_registration(http, client_name="Audited client", redirect_uris=CLAUDE_CALLBACKS[1:])
    assert response.status_code == 201
    client_id = response.json()["client_id"]
    recorded = [e for e in audit_events_here("oauth.client_registered") if e["detail"]["client_id"] == client_id]
    assert len(recorded) == 1
    assert recorded[0]["client_address"] == "198.51.100.23" and recorded[0]["detail"]["source"] == "dcr"
    assert "Audited client" in str(recorded[0]["detail"]["client"])


def test_registration_is_rate_limited_per_address(settings: Any) -> None:
    settings.REGISTRATION_RATE_LIMIT = 2
    limited = web_client(REMOTE_ADDR="203.0.113.7")
    assert post_registration(limited).status_code == 201
    assert post_registration(limited).status_code == 201
    refused = post_registration(limited)
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
    assert int(refused["Retry-After"]) > 0
    assert Application.objects.count() == 2
    assert post_registration(web_client(REMOTE_ADDR="203.0.113.8")).status_code == 201  # another address: its own


class Listener:
    """A TCP listener on loopback that counts connections (a CIMD fetch that got through would connect)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_client_id_metadata_document_on_a_private_address_is_never_fetched(host: str) -> None:
    listener = Listener()
    admin = AdminHere()
    try:
        client_id = f"https://{host}:{listener.port}/oauth/client.json"
        _, challenge = pkce()
        page = admin.consent_page(authorize_url(HERE, Client(client_id, None, CLAUDE_CALLBACKS[0]), challenge))
        assert page.status_code == 400 and "Location" not in page
        assert listener.connections == 0
        assert not Application.objects.filter(client_id=client_id).exists()
    finally:
        listener.close()


def test_nul_characters_in_registrations_and_token_requests_are_refused_alike_on_every_database() -> None:
    """PostgreSQL cannot store or even compare a NUL (a 500 there), SQLite would: both answer 400."""
    for metadata in ({"client_name": "a\x00b"}, {"redirect_uris": [CLAUDE_CALLBACKS[0] + "\x00"]}):
        refused = post_registration(**metadata)
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_client_metadata", refused.content
    exchange = {"grant_type": "authorization_code", "code": "x\x00y", "client_id": "c\x00", "code_verifier": "v" * 43}
    assert post_form(web_client(), "/oauth/token/", exchange).status_code == 400
    assert web_client().get("/oauth/authorize/", {"client_id": "c\x00"}).status_code == 400
