"""Driving the OAuth authorization server of a live server as a client and as the admin in a browser would.

`AdminSession` signs in on the admin's login page and answers consent pages by submitting the form with its CSRF
token; the other helpers register clients, build PKCE authorization requests and exchange codes; `MemoryStorage` keeps
the official Python SDK client's tokens.
Reads of a live server's database (`audit_events`, `bearer_token_id`, `application_id`, `newest_access_token_id`)
go to it directly through `server.database`; `shell` (a Django start-up, seconds) is for what needs the models:
writes that hash, create or save through them.

The same for this process (unit tests, Django's test client against this process's test database, at the URLs its
settings give): `HERE` for `authorize_url`, `web_client`, `register_here`, `AdminHere`, `exchange_here`,
`refresh_here`, `obtain_tokens_here` and `audit_events_here`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
from django.conf import settings
from django.test import Client as DjangoClient
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from tests.live import INITIALIZE, MCP_HEADERS, LiveServer

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse as TestResponse

LOOPBACK_REDIRECT = "http://127.0.0.1:33418/callback"


class MemoryStorage:
    """The SDK's TokenStorage, in memory, keeping every token response it was given."""

    def __init__(self) -> None:
        self.history: list[OAuthToken] = []
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.history[-1] if self.history else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.history.append(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def pkce() -> tuple[str, str]:
    """A code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def query_of(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query, keep_blank_values=True).items()}


class FormParser(HTMLParser):
    """The hidden inputs of a page's form: the one with `form_id`, or else the first."""

    def __init__(self, form_id: str | None = None) -> None:
        super().__init__()
        self.form_id = form_id
        self.inputs: dict[str, str] = {}
        self._in_form = False
        self._done = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {key: value or "" for key, value in attrs}
        if tag == "form" and not self._done and self.form_id in (None, attributes.get("id")):
            self._in_form = True
        elif tag == "input" and self._in_form and attributes.get("type") == "hidden" and "name" in attributes:
            self.inputs[attributes["name"]] = attributes.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._in_form:
            self._in_form, self._done = False, True


def hidden_inputs(html: str, form_id: str | None = None) -> dict[str, str]:
    parser = FormParser(form_id)
    parser.feed(html)
    return parser.inputs


@dataclass
class Client:
    client_id: str
    client_secret: str | None
    redirect_uri: str
    registration: dict[str, object] = field(default_factory=dict)

    @classmethod
    def registered(cls, registration: dict[str, object], redirect_uri: str) -> Client:
        """The client a registration endpoint's 201 answer describes."""
        secret = registration.get("client_secret")
        return cls(str(registration["client_id"]), str(secret) if secret else None, redirect_uri, registration)

    def credentials(self) -> dict[str, str]:
        return {"client_id": self.client_id, **({"client_secret": self.client_secret} if self.client_secret else {})}


class Site(Protocol):
    """Where an authorization server is: a live server, or this process (`HERE`)."""

    @property
    def url(self) -> str: ...

    @property
    def mcp_url(self) -> str: ...


def registration_metadata(redirect_uri: str, **metadata: object) -> dict[str, object]:
    """A client's registration: a confidential client of the authorization-code flow, with `metadata` on top."""
    return {
        "client_name": "Test client",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_post",
        **metadata,
    }


def register(server: LiveServer, redirect_uri: str = LOOPBACK_REDIRECT, **metadata: object) -> Client:
    body = registration_metadata(redirect_uri, **metadata)
    response = httpx2.post(f"{server.url}/oauth/register/", json=body, timeout=30)
    assert response.status_code == 201, response.text
    return Client.registered(response.json(), redirect_uri)


def authorize_url(server: Site, client: Client, challenge: str | None, state: str = "st-1", **extra: str | None) -> str:
    """The authorization request's URL; an `extra` of None leaves that parameter out."""
    params = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": client.redirect_uri,
        "state": state,
        "scope": "mcp",
        "resource": server.mcp_url,
        **({"code_challenge": challenge, "code_challenge_method": "S256"} if challenge else {}),
        **extra,
    }
    return f"{server.url}/oauth/authorize/?{urlencode({k: v for k, v in params.items() if v is not None})}"


def consent_answer(page_html: str, approve: bool) -> dict[str, str]:
    """The consent page's form as the admin submits it: its hidden fields, and "allow" to approve (deny without)."""
    form = hidden_inputs(page_html, "consent-form")
    if approve:
        form["allow"] = "Authorize"
    return form


class AdminSession:
    """An HTTP client holding a signed-in admin session, as a browser would."""

    def __init__(self, server: LiveServer, username: str = "admin", password: str | None = None) -> None:
        self.server = server
        self.http = httpx2.Client(base_url=server.url, timeout=30, follow_redirects=False)
        login = self.http.get("/admin/login/")
        form = hidden_inputs(login.text, "login-form")
        answer = self.http.post(
            "/admin/login/",
            data={**form, "username": username, "password": password or server.admin_password, "next": "/admin/"},
            headers={"Referer": f"{server.url}/admin/login/"},
        )
        assert answer.status_code == 302, f"admin login failed: {answer.status_code}"

    def consent_page(self, url: str) -> httpx2.Response:
        return self.http.get(url)

    def decide(self, url: str, approve: bool = True) -> str:
        """Open the consent page at `url` and submit it; the Location the server redirects to."""
        page = self.consent_page(url)
        assert page.status_code == 200, f"no consent page: {page.status_code} {page.headers.get('location')}"
        answer = self.http.post(url, data=consent_answer(page.text, approve), headers={"Referer": url})
        assert answer.status_code == 302, answer.text[:500]
        return answer.headers["location"]

    def close(self) -> None:
        self.http.close()


def code_exchange(client: Client, code: str, verifier: str | None, **extra: str) -> dict[str, str]:
    """The token request's form that exchanges an authorization code (`verifier` None: without code_verifier)."""
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": client.redirect_uri,
        **client.credentials(),
        **extra,
    }
    if verifier is not None:
        data["code_verifier"] = verifier
    return data


def exchange(server: LiveServer, client: Client, code: str, verifier: str | None, **extra: str) -> httpx2.Response:
    data = code_exchange(client, code, verifier, **extra)
    return httpx2.post(f"{server.url}/oauth/token/", data=data, timeout=30)


def refresh_request(client: Client, refresh_token: str) -> dict[str, str]:
    """The token request's form that exchanges a refresh token."""
    return {"grant_type": "refresh_token", "refresh_token": refresh_token, **client.credentials()}


def refresh(server: LiveServer, client: Client, refresh_token: str) -> httpx2.Response:
    return httpx2.post(f"{server.url}/oauth/token/", data=refresh_request(client, refresh_token), timeout=30)


def obtain_tokens(server: LiveServer, admin: AdminSession, client: Client, scope: str = "mcp") -> dict[str, object]:
    """The whole authorization-code flow with S256 PKCE; the token response."""
    verifier, challenge = pkce()
    location = admin.decide(authorize_url(server, client, challenge, scope=scope))
    response = exchange(server, client, query_of(location)["code"], verifier)
    assert response.status_code == 200, response.text
    return dict(response.json())


def mcp_status(server: LiveServer, token: str) -> httpx2.Response:
    return httpx2.post(
        server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"}, timeout=10
    )


def shell(server: LiveServer, code: str) -> str:
    """Run Python in the server's Django environment (same database); its stdout."""
    return server.manage("shell", "--no-imports", "-c", code).stdout


def insert_access_token(server: LiveServer, *, scope: str, resource: list[str], with_user: bool = True) -> str:
    """An access token row made directly in the database, for shapes our own server never issues."""
    code = f"""
import secrets, datetime
from django.utils import timezone
from django.contrib.auth import get_user_model
from oauth2_provider.models import AccessToken, Application, set_token_value
app = Application.objects.create(name="inserted", client_type="public", authorization_grant_type="authorization-code",
                                 redirect_uris="https://example.com/cb")
raw = secrets.token_urlsafe(32)
token = AccessToken(application=app, user=get_user_model().objects.get(username="admin") if {with_user!r} else None,
                    scope={scope!r}, resource={json.dumps(resource)}, expires=timezone.now() + datetime.timedelta(hours=1))
set_token_value(token, raw)
token.save()
print(raw)
"""
    return shell(server, code).strip().splitlines()[-1]


# --- a live server's database read directly (tests/database.py): milliseconds, where `shell` starts Django ---------


def audit_events(server: LiveServer, name: str) -> list[dict[str, Any]]:
    """The audit records of event `name`, oldest first: their detail (decoded), username, credential_kind and
    client_address, as `audit_events_here` gives them."""
    rows = server.database.query(
        "SELECT detail, username, credential_kind, client_address FROM audit_auditrecord WHERE event = %s ORDER BY id",
        name,
    )
    # JSON columns come back as their text on both databases; SQL NULL is a detail of None, as Django reads it.
    return [{**row, "detail": None if row["detail"] is None else json.loads(row["detail"])} for row in rows]


def bearer_token_id(server: LiveServer, name: str) -> int:
    """The id of the one bearer token named `name` (a revoked one too), as `BearerToken.objects.get(name=name)`."""
    return int(server.database.one("SELECT id FROM oauth_bearertoken WHERE name = %s", name)["id"])


def application_id(server: LiveServer, client_id: str) -> int:
    """The id of the OAuth client `client_id`, as `Application.objects.get(client_id=client_id)`."""
    sql = "SELECT id FROM oauth2_provider_application WHERE client_id = %s"
    return int(server.database.one(sql, client_id)["id"])


def newest_access_token_id(server: LiveServer, client_id: str | None = None) -> int:
    """The id of the newest access token issued to a user (of the client `client_id`, if given), as
    `AccessToken.objects.filter(user__isnull=False[, application__client_id=client_id]).latest("id")`."""
    if client_id is None:
        sql = "SELECT id FROM oauth2_provider_accesstoken WHERE user_id IS NOT NULL ORDER BY id DESC LIMIT 1"
        return int(server.database.one(sql)["id"])
    sql = (
        "SELECT t.id FROM oauth2_provider_accesstoken t JOIN oauth2_provider_application a ON a.id = t.application_id"
        " WHERE t.user_id IS NOT NULL AND a.client_id = %s ORDER BY t.id DESC LIMIT 1"
    )
    return int(server.database.one(sql, client_id)["id"])


# --- the same in this process: Django's test client against this process's test database (unit tests) --------------


class ThisProcess:
    """The server this process's settings describe: its public URL and its one resource, as the views see them."""

    @property
    def url(self) -> str:
        return str(settings.PUBLIC_URL)

    @property
    def mcp_url(self) -> str:
        return str(settings.MCP_RESOURCE_URL)


HERE = ThisProcess()
FORM = "application/x-www-form-urlencoded"


def web_client(**defaults: Any) -> DjangoClient:
    """Django's test client addressed as a browser at settings.PUBLIC_URL is: its Host header, and https (as the
    proxy says) if the URL is https. CSRF is checked as for a browser: a form's token must be sent with it."""
    public = urlsplit(settings.PUBLIC_URL)
    environ: dict[str, Any] = {"HTTP_HOST": public.netloc, **defaults}
    if public.scheme == "https":
        environ["HTTP_X_FORWARDED_PROTO"] = "https"  # settings.SECURE_PROXY_SSL_HEADER, for an https public URL
    return DjangoClient(enforce_csrf_checks=True, **environ)


def post_form(http: DjangoClient, url: str, data: dict[str, str], **extra: Any) -> TestResponse:
    """POST `data` url-encoded, as browsers and OAuth clients send forms (the test client's default is multipart)."""
    return http.post(url, urlencode(data), content_type=FORM, **extra)


def register_here(redirect_uri: str = LOOPBACK_REDIRECT, **metadata: object) -> Client:
    """`register`, at this process's /oauth/register/."""
    body = json.dumps(registration_metadata(redirect_uri, **metadata))
    response = web_client().post("/oauth/register/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    return Client.registered(response.json(), redirect_uri)


class AdminHere:
    """`AdminSession` in this process: a superuser (made in the test database) signed in to Django's test client,
    answering consent pages by submitting the form with its CSRF token."""

    def __init__(self, username: str = "admin") -> None:
        from django.contrib.auth import get_user_model

        self.user = get_user_model().objects.create_superuser(username)
        self.http = web_client()
        self.http.force_login(self.user)

    def consent_page(self, url: str) -> TestResponse:
        return self.http.get(url)

    def decide(self, url: str, approve: bool = True) -> str:
        """Open the consent page at `url` and submit it; the Location the server redirects to."""
        page = self.consent_page(url)
        assert page.status_code == 200, f"no consent page: {page.status_code} {page.get('Location')}"
        answer = post_form(self.http, url, consent_answer(page.content.decode(), approve), HTTP_REFERER=url)
        assert answer.status_code == 302, answer.content[:500]
        return str(answer["Location"])


def exchange_here(client: Client, code: str, verifier: str | None, **extra: str) -> TestResponse:
    """`exchange`, at this process's /oauth/token/."""
    return post_form(web_client(), "/oauth/token/", code_exchange(client, code, verifier, **extra))


def refresh_here(client: Client, refresh_token: str) -> TestResponse:
    """`refresh`, at this process's /oauth/token/."""
    return post_form(web_client(), "/oauth/token/", refresh_request(client, refresh_token))


def obtain_tokens_here(admin: AdminHere, client: Client, scope: str = "mcp") -> dict[str, Any]:
    """`obtain_tokens` in this process: the whole authorization-code flow with S256 PKCE; the token response."""
    verifier, challenge = pkce()
    location = admin.decide(authorize_url(HERE, client, challenge, scope=scope))
    response = exchange_here(client, query_of(location)["code"], verifier)
    assert response.status_code == 200, response.content
    return dict(response.json())


def audit_events_here(name: str) -> list[dict[str, Any]]:
    """`audit_events` of this process's test database."""
    from audit.models import AuditRecord

    rows = AuditRecord.objects.filter(event=name).order_by("id")
    return [
        dict(detail=r.detail, username=r.username, credential_kind=r.credential_kind, client_address=r.client_address)
        for r in rows
    ]
