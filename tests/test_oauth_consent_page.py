"""The consent page says who the tools run as from what the MCP server last reported (oauth.agent_identity), never by
asking the executor itself; and oauth stays below mcpserver. In-process, with the test client."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from oauth2_provider.models import Application

from oauth.agent_identity import agent_user, remember_agent_user
from tests.oauth_flow import pkce

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def reported_user() -> Iterator[None]:
    """Whatever a test reports as the agent user is forgotten after it."""
    before = agent_user()
    yield
    remember_agent_user(before)


@pytest.fixture
def consent_page(db: None, reported_user: None) -> Iterator[Client]:
    user = get_user_model().objects.create_user("approver", password="x", is_staff=True)
    browser = Client()
    browser.force_login(user)
    yield browser


def scope_text(browser: Client, scope: str) -> str:
    uri = "https://claude.ai/api/mcp/auth_callback"
    application = Application.objects.create(
        name="Claude", client_type="public", authorization_grant_type="authorization-code", redirect_uris=uri
    )
    _, challenge = pkce()
    query = {"response_type": "code", "client_id": application.client_id, "redirect_uri": uri, "scope": scope,
             "state": "s", "code_challenge": challenge, "code_challenge_method": "S256"}  # fmt: skip
    response = browser.get(f"/oauth/authorize/?{urlencode(query)}")
    assert response.status_code == 200 and b'id="consent-form"' in response.content
    return response.content.decode()


@pytest.mark.parametrize(
    ("scope", "expected"),
    [("mcp", "Run any command as sandstorm-agent on this host"), ("mcp:read", "as sandstorm-agent on this host")],
)
def test_the_consent_page_names_the_os_user_the_executor_reported(
    consent_page: Client, scope: str, expected: str
) -> None:
    remember_agent_user("sandstorm-agent")
    assert expected in scope_text(consent_page, scope)


def test_the_consent_page_says_so_when_the_executor_has_not_reported_its_user(consent_page: Client) -> None:
    remember_agent_user(None)
    assert "Run any command as the agent user (the tool executor has not reported yet) on this host" in scope_text(
        consent_page, "mcp"
    )


def imported_modules(package: str) -> set[tuple[str, str]]:
    """(file, imported module) for every import in the package's sources."""
    found = set()
    for source in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                found |= {(str(source.relative_to(REPO)), alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add((str(source.relative_to(REPO)), node.module))
    return found


@pytest.mark.parametrize("above", ["mcpserver", "sandstorm_site"])
def test_oauth_imports_nothing_of_the_layers_above_it(above: str) -> None:
    offending = {(file, module) for file, module in imported_modules("oauth") if module.split(".")[0] == above}
    assert not offending


def test_audit_names_no_admin_url_of_oauth() -> None:
    offending = [str(source) for source in (REPO / "audit").rglob("*.py") if "admin:oauth_" in source.read_text()]
    assert not offending
