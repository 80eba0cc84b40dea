"""Housekeeping commands (`prune_clients`, the toolkit's `cleartokens`) and the throttling of admin logins."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from tests.live import LiveServer, running_server
from tests.oauth_flow import (
    AdminSession,
    audit_events,
    hidden_inputs,
    insert_access_token,
    obtain_tokens,
    register,
    shell,
)

pytestmark = [pytest.mark.live]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("oauth-commands"), SANDSTORM_REGISTRATION_RATE_LIMIT="0") as live:
        yield live


def backdate_client(server: LiveServer, client_id: str, days: int) -> None:
    shell(
        server,
        "from datetime import timedelta; from django.utils import timezone; from oauth2_provider.models import Application; "
        f"Application.objects.filter(client_id={client_id!r}).update(created=timezone.now() - timedelta(days={days}))",
    )


def client_exists(server: LiveServer, client_id: str) -> bool:
    sql = "SELECT COUNT(*) AS n FROM oauth2_provider_application WHERE client_id = %s"
    return int(server.database.one(sql, client_id)["n"]) > 0


def test_prune_clients_removes_only_old_clients_that_never_got_a_token(server: LiveServer) -> None:
    admin = AdminSession(server)
    stale, used, fresh = (
        register(server, client_name="stale"),
        register(server, client_name="used"),
        register(server, client_name="fresh"),
    )
    obtain_tokens(server, admin, used)
    backdate_client(server, stale.client_id, 8)
    backdate_client(server, used.client_id, 30)

    dry = server.manage("prune_clients", "--dry-run")
    assert "Would remove 1 unused client(s)" in dry.stdout and client_exists(server, stale.client_id)

    pruned = server.manage("prune_clients")
    assert f"Removed 1 unused client(s): stale (client {stale.client_id})" in pruned.stdout
    assert not client_exists(server, stale.client_id)
    assert client_exists(server, used.client_id) and client_exists(server, fresh.client_id)
    assert [e["detail"]["client_id"] for e in audit_events(server, "oauth.client_pruned")] == [stale.client_id]
    assert "Removed 0 unused client(s)." in server.manage("prune_clients").stdout
    admin.close()


def test_cleartokens_removes_expired_access_tokens(server: LiveServer) -> None:
    insert_access_token(server, scope="mcp", resource=[server.mcp_url])
    shell(
        server,
        "from datetime import timedelta; from django.utils import timezone; from oauth2_provider.models import AccessToken; "
        "AccessToken.objects.filter(application__name='inserted').update(expires=timezone.now() - timedelta(seconds=1))",
    )
    server.manage("cleartokens")
    remaining = server.database.one(
        "SELECT COUNT(*) AS n FROM oauth2_provider_accesstoken t"
        " JOIN oauth2_provider_application a ON a.id = t.application_id WHERE a.name = 'inserted'"
    )
    assert remaining["n"] == 0


def try_login(server: LiveServer, username: str, password: str) -> httpx2.Response:
    with httpx2.Client(base_url=server.url, timeout=30) as http:
        form = hidden_inputs(http.get("/admin/login/").text, "login-form")
        return http.post("/admin/login/", data={**form, "username": username, "password": password, "next": "/admin/"})


def test_failed_admin_logins_are_throttled_per_username_and_audited(server: LiveServer) -> None:
    shell(
        server,
        "from django.contrib.auth import get_user_model; "
        "get_user_model().objects.create_user('victim', password='victim-password-123', is_staff=True)",
    )
    assert try_login(server, "victim", "victim-password-123").status_code == 302
    for attempt in range(5):
        assert try_login(server, "victim", f"guess-{attempt}").status_code == 200
    refused = try_login(server, "victim", "victim-password-123")
    assert refused.status_code == 200 and "Too many failed sign-in attempts" in refused.text
    assert len([e for e in audit_events(server, "admin.login_failed") if e["username"] == "victim"]) == 5
    assert [e["username"] for e in audit_events(server, "admin.login_throttled")] == ["victim"]
    assert try_login(server, "admin", server.admin_password).status_code == 302, "other users are not locked out"
