"""The console's page of open MCP sessions and its Disconnect, through Django's test client, with the server's side
(mcpserver.session_console: every worker's sessions, ending one) stood in for: what the page shows and escapes, who
may see and disconnect what, the confirmation, CSRF, the audit record, and the "open sessions" line of a
credential's page. The server's side itself is tested in-process (test_open_sessions_inprocess) and live."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from audit.models import AuditRecord
from mcpserver import session_views
from mcpserver.session_console import Listing
from oauth.tokens import issue_token

pytestmark = pytest.mark.django_db
SESSIONS = "/admin/sessions/"


@pytest.fixture
def boss(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_superuser("boss", password="pw-for-tests-123")


@pytest.fixture
def console(client: Client, boss: User) -> Client:
    client.force_login(boss)
    return client


def row(session_id: str = "w1-abc", **fields: Any) -> dict[str, Any]:
    now = time.time()
    return {
        "session_id": session_id, "worker": 1, "key": "bearer:7", "credential_kind": "bearer", "credential_id": 7,
        "application_id": None, "credential_name": "laptop <b>", "username": "boss", "client_address": "198.51.100.4",
        "user_agent": "claude-code/2.1", "opened_at": now - 60, "last_request_at": now, "busy": False, **fields,
    }  # fmt: skip


class Server:
    """Stands in for mcpserver.session_console in the views: the sessions it lists, and those ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]], **listing: Any) -> None:
        self.rows = rows
        self.ended: list[tuple[str, str]] = []
        self.asked: list[str] = []
        self.listing = listing
        monkeypatch.setattr(session_views, "list_sessions", self.list_sessions)
        monkeypatch.setattr(session_views, "end_session", self.end_session)
        monkeypatch.setattr(session_views, "count_sessions", self.count_sessions)

    async def list_sessions(self, credential: str = "") -> Listing:
        self.asked.append(credential)
        return Listing(rows=list(self.rows), serving=True, **self.listing)

    async def end_session(self, session_id: str, by: str) -> dict[str, Any] | None:
        found = next((r for r in self.rows if r["session_id"] == session_id), None)
        if found is not None:
            self.rows.remove(found)
            self.ended.append((session_id, by))
        return found

    async def count_sessions(self, credential: str) -> int | None:
        return sum(1 for r in self.rows if r["key"] == credential)


def test_the_home_page_links_to_the_sessions_page(console: Client) -> None:
    assert f'href="{SESSIONS}" id="task-sessions"' in console.get("/admin/").content.decode()


def test_a_process_that_serves_no_mcp_says_so(console: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing(credential: str = "") -> Listing:
        return Listing()  # mcpserver.session_console's answer where no MCP application was built

    monkeypatch.setattr(session_views, "list_sessions", nothing)
    assert 'id="sessions-not-served"' in console.get(SESSIONS).content.decode()


def test_the_page_lists_each_session_escaped_with_links(console: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    Server(monkeypatch, [row(), row("w2-def", key="oauth:3:1", credential_kind="oauth", application_id=3,
                                    credential_name="Claude (client x)", worker=2)], silent_workers=[3])  # fmt: skip
    page = console.get(SESSIONS)
    content = page.content.decode()
    assert "no-store" in page["Cache-Control"]
    assert "laptop &lt;b&gt;" in content and "laptop <b>" not in content
    assert "198.51.100.4" in content and "claude-code/2.1" in content
    assert reverse("admin:oauth_bearertoken_change", args=[7]) in content
    assert reverse("admin:oauth_connectedapp_change", args=[3]) in content
    assert reverse("admin:mcp_session_disconnect", args=["w1-abc"]) in content
    assert 'id="sessions-silent"' in content and "2 open sessions" in content


def test_the_filter_by_credential_is_passed_on_and_anything_else_ignored(
    console: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(monkeypatch, [row()])
    console.get(f"{SESSIONS}?credential=bearer:7")
    console.get(f"{SESSIONS}?credential=oauth:3:")
    console.get(f"{SESSIONS}?credential=bearer:7' or 1=1")
    assert server.asked == ["bearer:7", "oauth:3:", ""]


def test_disconnecting_asks_first_then_ends_the_session_and_records_it(
    console: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(monkeypatch, [row(busy=True)])
    url = reverse("admin:mcp_session_disconnect", args=["w1-abc"])
    confirm = console.get(f"{url}?next=/admin/sessions/%3Fcredential%3Dbearer:7")
    content = confirm.content.decode()
    assert 'id="disconnect-form"' in content and "csrfmiddlewaretoken" in content and "revokes nothing" in content
    assert 'value="/admin/sessions/?credential=bearer:7"' in content
    assert server.ended == []
    response = console.post(url, {"next": "/admin/sessions/?credential=bearer:7"})
    assert response.status_code == 302 and response["Location"] == "/admin/sessions/?credential=bearer:7"
    assert server.ended == [("w1-abc", "boss")]
    [record] = AuditRecord.objects.filter(event="console.session_disconnected")
    assert record.username == "boss" and record.credential_kind == "session"
    assert record.detail == {
        "session_id": "w1-abc", "worker": 1, "credential": "bearer:7", "credential_name": "laptop <b>",
        "owner": "boss", "session_address": "198.51.100.4", "session_user_agent": "claude-code/2.1", "busy": True,
    }  # fmt: skip


def test_a_session_no_longer_open_is_not_disconnected_nor_recorded(
    console: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    Server(monkeypatch, [])
    response = console.post(reverse("admin:mcp_session_disconnect", args=["w1-gone"]), follow=True)
    assert "no longer open" in response.content.decode()
    assert not AuditRecord.objects.filter(event="console.session_disconnected").exists()


def test_the_disconnect_post_needs_the_csrf_token(boss: User, monkeypatch: pytest.MonkeyPatch) -> None:
    server = Server(monkeypatch, [row()])
    client = Client(enforce_csrf_checks=True)
    client.force_login(boss)
    assert client.post(reverse("admin:mcp_session_disconnect", args=["w1-abc"])).status_code == 403
    assert server.ended == []


def test_a_next_to_another_site_is_not_followed(console: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    Server(monkeypatch, [row()])
    response = console.post(reverse("admin:mcp_session_disconnect", args=["w1-abc"]), {"next": "https://evil.example/"})
    assert response["Location"] == SESSIONS


def test_who_may_only_view_tokens_sees_their_sessions_but_cannot_disconnect(
    django_user_model: type[User], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(monkeypatch, [row(), row("w1-app", key="oauth:3:1", credential_kind="oauth", application_id=3,
                                             credential_name="Claude app")])  # fmt: skip
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_bearertoken"))
    client = Client()
    client.force_login(viewer)
    content = client.get(SESSIONS).content.decode()
    assert "laptop &lt;b&gt;" in content and "Claude app" not in content, "only the kinds it may view"
    assert "session-disconnect" not in content
    assert client.post(reverse("admin:mcp_session_disconnect", args=["w1-abc"])).status_code == 403
    assert server.ended == []
    nobody = django_user_model.objects.create_user("nobody", is_staff=True)
    client.force_login(nobody)
    assert client.get(SESSIONS).status_code == 403


def test_a_token_page_says_how_many_sessions_it_holds_open(
    console: Client, boss: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, _ = issue_token(boss, "laptop")
    Server(
        monkeypatch,
        [row(key=f"bearer:{token.pk}"), row("w1-two", key=f"bearer:{token.pk}"), row("w1-3", key="bearer:0")],
    )
    content = console.get(reverse("admin:oauth_bearertoken_change", args=[token.pk])).content.decode()
    assert f'href="{SESSIONS}?credential=bearer%3A{token.pk}">open sessions: 2</a>' in content
