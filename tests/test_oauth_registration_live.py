"""Dynamic client registration and client ID metadata documents: open, but only for what an MCP client needs."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx2
import pytest

from tests.live import LiveServer, running_server
from tests.oauth_flow import AdminSession, Client, audit_events, authorize_url, pkce, register, shell

pytestmark = [pytest.mark.live]
CLAUDE_CALLBACKS = ["https://claude.ai/api/mcp/auth_callback", "https://claude.com/api/mcp/auth_callback"]


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


def post_registration(server: LiveServer, **metadata: object) -> httpx2.Response:
    body = {"client_name": "probe", "redirect_uris": CLAUDE_CALLBACKS[:1], **metadata}
    return httpx2.post(f"{server.url}/oauth/register/", json=body, timeout=30)


def test_claude_ai_registers_anonymously_with_client_secret_post(server: LiveServer) -> None:
    response = post_registration(
        server,
        client_name="Claude",
        redirect_uris=CLAUDE_CALLBACKS,
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="client_secret_post",
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["client_secret"] and body["token_endpoint_auth_method"] == "client_secret_post"
    assert body["redirect_uris"] == CLAUDE_CALLBACKS
    assert set(body["grant_types"]) == {"authorization_code", "refresh_token"}
    assert response.headers["cache-control"] == "no-store"


def test_a_public_client_registers_with_auth_method_none(server: LiveServer) -> None:
    response = post_registration(
        server, redirect_uris=["http://localhost:8976/callback"], token_endpoint_auth_method="none"
    )
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
def test_grant_types_other_than_authorization_code_and_refresh_token_are_refused(
    server: LiveServer, grant_types: list[str]
) -> None:
    response = post_registration(server, grant_types=grant_types)
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_metadata"


def test_a_client_credentials_token_cannot_be_had_even_by_asking_the_token_endpoint(server: LiveServer) -> None:
    client = register(server, CLAUDE_CALLBACKS[0])
    response = httpx2.post(
        f"{server.url}/oauth/token/",
        data={"grant_type": "client_credentials", "scope": "mcp", **client.credentials()},
        timeout=30,
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
def test_redirect_uris_must_be_https_or_loopback(server: LiveServer, uri: str) -> None:
    response = post_registration(server, redirect_uris=[uri])
    assert response.status_code == 400 and response.json()["error"] == "invalid_redirect_uri"


def test_unknown_token_endpoint_auth_methods_and_response_types_are_refused(server: LiveServer) -> None:
    assert post_registration(server, token_endpoint_auth_method="private_key_jwt").status_code == 400
    assert post_registration(server, response_types=["token"]).status_code == 400


def test_a_registered_client_cannot_widen_its_grant_types_through_rfc_7592(server: LiveServer) -> None:
    client = register(server, CLAUDE_CALLBACKS[0])
    registration = client.registration
    headers = {"Authorization": f"Bearer {registration['registration_access_token']}"}
    body = {"redirect_uris": CLAUDE_CALLBACKS, "grant_types": ["client_credentials"]}
    response = httpx2.put(str(registration["registration_client_uri"]), json=body, headers=headers, timeout=30)
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_metadata"


def test_registrations_are_recorded_in_the_audit_log(server: LiveServer) -> None:
    client = register(server, CLAUDE_CALLBACKS[1], client_name="Audited client")
    recorded = [
        e for e in audit_events(server, "oauth.client_registered") if e["detail"]["client_id"] == client.client_id
    ]
    assert len(recorded) == 1
    assert recorded[0]["client_address"] == "127.0.0.1" and recorded[0]["detail"]["source"] == "dcr"
    assert "Audited client" in str(recorded[0]["detail"]["client"])


def test_registration_is_rate_limited_per_address(tmp_path: Path) -> None:
    with running_server(tmp_path, SANDSTORM_REGISTRATION_RATE_LIMIT="2") as limited:
        assert post_registration(limited).status_code == 201
        assert post_registration(limited).status_code == 201
        refused = post_registration(limited)
        assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"
        assert int(refused.headers["retry-after"]) > 0


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
def test_a_client_id_metadata_document_on_a_private_address_is_never_fetched(server: LiveServer, host: str) -> None:
    listener = Listener()
    admin = AdminSession(server)
    try:
        client_id = f"https://{host}:{listener.port}/oauth/client.json"
        _, challenge = pkce()
        page = admin.consent_page(authorize_url(server, Client(client_id, None, CLAUDE_CALLBACKS[0]), challenge))
        assert page.status_code == 400 and "location" not in page.headers
        assert listener.connections == 0
        exists = shell(
            server,
            f"from oauth2_provider.models import Application; print(Application.objects.filter(client_id={client_id!r}).exists())",
        )
        assert exists.strip() == "False"
    finally:
        admin.close()
        listener.close()


def test_nul_characters_in_registrations_and_token_requests_are_refused_alike_on_every_database(
    server: LiveServer,
) -> None:
    """PostgreSQL cannot store or even compare a NUL (a 500 there), SQLite would store it: both answer 400."""
    for metadata in ({"client_name": "a\x00b"}, {"redirect_uris": [CLAUDE_CALLBACKS[0] + "\x00"]}):
        refused = post_registration(server, **metadata)
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_client_metadata", refused.text
    exchange = {"grant_type": "authorization_code", "code": "x\x00y", "client_id": "c\x00", "code_verifier": "v" * 43}
    assert httpx2.post(f"{server.url}/oauth/token/", data=exchange, timeout=30).status_code == 400
    assert httpx2.get(f"{server.url}/oauth/authorize/", params={"client_id": "c\x00"}, timeout=30).status_code == 400
