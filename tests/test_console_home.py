"""The console's home page is a status page (sandstorm_site/home.py): executor, running calls, connected clients,
expiring tokens, failures of the last day, the last rotation, and a link to every task."""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from audit.log import Actor, call_finished, call_started
from audit.models import AuditRecord, ServerInstance
from oauth import agent_identity
from oauth.models import BearerToken, Revocation, new_token_secret

pytestmark = pytest.mark.django_db
XSS = "<img src=x onerror=alert(1)>"


def who(name: str = "laptop", credential_id: str = "7", kind: str = "bearer") -> Actor:
    return Actor(user_id=1, username="admin", credential_kind=kind, credential_id=credential_id, credential_name=name)


def token(name: str, expires_in: timedelta | None, *, revoked: bool = False) -> BearerToken:
    user = User.objects.get(username="admin")
    row = BearerToken(name=name, user=user, expires_at=timezone.now() + expires_in if expires_in else None)
    row.set_secret(new_token_secret())
    if revoked:
        row.revoked_at = timezone.now()
    row.save()
    return row


def section(html: str, section_id: str) -> str:
    found = re.search(rf'<section[^>]*id="{section_id}"[^>]*>(.*?)</section>', html, re.S)
    assert found, f"no section #{section_id}"
    return found.group(1)


@pytest.fixture
def home(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setattr(agent_identity, "_report", None)
    return admin_client


def test_the_home_page_shows_each_item_of_the_status(home: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_identity.remember_agent_user("sandstorm-agent")
    ServerInstance.objects.create(id="alive", hostname=socket.gethostname(), pid=os.getpid())
    ServerInstance.objects.create(id="gone", hostname=socket.gethostname(), pid=os.getpid(), stopped_at=timezone.now())
    running = call_started(who(XSS, "8"), "terminal_exec", {"command": "sleep 600"}, "alive")
    call_started(who(), "git_clone", {"repo_url": "x"}, "gone")  # unfinished, but its server stopped
    for outcome in ("error", "error", "timeout", "interrupted", "ok"):
        call_finished(call_started(who(), "terminal_exec", {"command": "false"}, "alive"), outcome, duration_ms=5)
    old = call_started(who("old-laptop", "99"), "terminal_exec", {"command": "false"}, "alive")
    call_finished(old, "error", duration_ms=5)
    AuditRecord.objects.filter(call_id=old.call_id).update(created_at=timezone.now() - timedelta(days=2))
    soon = token("expires-soon", timedelta(days=3))
    token("expires-later", timedelta(days=10))
    token("revoked-soon", timedelta(days=2), revoked=True)
    Revocation.objects.create(reason=Revocation.REASON_ROTATION, prefixes=["bearer:", "oauth:"], username="alice")

    html = home.get("/admin/").content.decode()

    executor = section(html, "status-executor")
    assert "up" in executor and "sandstorm-agent" in executor
    calls = section(html, "running-calls")
    assert f'href="/admin/audit/auditrecord/{running.pk}/change/"' in calls
    assert "git_clone" not in calls, "a call of a stopped server is not running"
    assert XSS not in html and "&lt;img src=x" in calls
    clients = section(html, "connected-clients")
    assert "laptop" in clients and "old-laptop" not in clients
    assert 'href="/admin/audit/auditrecord/?credential=bearer%3A7' in clients
    expiring = section(html, "expiring-credentials")
    assert "expires-soon" in expiring and f'href="/admin/oauth/bearertoken/{soon.pk}/change/"' in expiring
    assert "in 2 days" in expiring or "in 3 days" in expiring
    assert "expires-later" not in expiring and "revoked-soon" not in expiring
    failures = section(html, "failures")
    counts = dict(
        re.findall(
            r'<tr class="outcome-(\w+)"><th scope="row">\w+</th>\s*<td class="count">(?:<a[^>]*>)?(\d+)', failures
        )
    )
    assert counts == {"error": "2", "timeout": "1", "denied": "0", "cancelled": "0", "interrupted": "1"}
    assert "<strong>4</strong> failed calls" in failures
    assert re.search(r'href="/admin/audit/auditrecord/\?outcome=error&amp;created_at__gte=[^"]+"', failures)
    assert "outcome=failed" in failures
    rotation = section(html, "last-rotation")
    assert "alice" in rotation
    tasks = section(html, "tasks")
    for link in (
        "/admin/oauth/bearertoken/", "/admin/oauth/bearertoken/add/", "/admin/oauth/connectedapp/",
        "/admin/audit/auditrecord/", "/admin/audit/securityevent/", "/admin/audit/overview/",
        "/admin/oauth/credentialrotation/",
    ):  # fmt: skip
        assert f'href="{link}"' in tasks, link
    assert 'id="all-models"' in html and "app-oauth" in html, "the stock list of models stays, lower on the page"


def test_the_failure_links_filter_the_audit_list_to_the_counted_calls(home: Client) -> None:
    for outcome in ("error", "ok"):
        call_finished(call_started(who(), "terminal_exec", {"command": "x"}, "i"), outcome, duration_ms=1)
    html = home.get("/admin/").content.decode()
    link = re.search(r'href="(/admin/audit/auditrecord/\?outcome=error&amp;[^"]+)"', html)
    assert link
    listed = home.get(link.group(1).replace("&amp;", "&"))
    assert listed.status_code == 200 and len(listed.context["cl"].result_list) == 1


def test_with_nothing_published_the_executor_is_unknown_not_up(home: Client) -> None:
    executor = section(home.get("/admin/").content.decode(), "status-executor")
    assert "unknown" in executor and "sandstorm-agent" not in executor
    agent_identity.remember_agent_user(None)
    assert "not answering" in section(home.get("/admin/").content.decode(), "status-executor")


def test_the_rotation_link_is_for_superusers_only(client: Client) -> None:
    staff = User.objects.create_user("helper", password="helper-password-123", is_staff=True)
    client.force_login(staff)
    html = client.get("/admin/").content.decode()
    assert "/admin/oauth/credentialrotation/" not in html and 'id="status-executor"' in html


def test_the_home_page_makes_a_bounded_number_of_queries(home: Client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for number in range(30):
        call_finished(call_started(who(f"t{number}", str(number)), "terminal_exec", {}, "i"), "error", duration_ms=1)
        token(f"soon-{number}", timedelta(days=1))
    with CaptureQueriesContext(connection) as queries:
        assert home.get("/admin/").status_code == 200
    assert len(queries) < 25, [query["sql"] for query in queries]


def test_the_home_page_says_which_kernel_protections_are_in_force(
    home: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_identity, "_confinement", None)
    executor = section(home.get("/admin/").content.decode(), "status-executor")
    assert "the executor has not said yet" in executor
    enforced = {"landlock_abi": 7, "profiles": {"read": "enforced", "workspace": "enforced"}}
    agent_identity.remember_agent_user("sandstorm-agent", enforced)
    executor = section(home.get("/admin/").content.decode(), "status-executor")
    assert "Landlock ABI 7" in executor and executor.count("enforced") == 2
    assert re.search(r'id="default-profile">workspace<', executor)  # development's default, enforceable here
    why = "this kernel (5.4) has no Landlock (Linux 5.13 or newer has)"
    agent_identity.remember_agent_user(
        "sandstorm-agent", {"landlock_abi": None, "profiles": {"read": why, "workspace": why}}
    )
    executor = section(home.get("/admin/").content.decode(), "status-executor")
    assert "not enforced" in executor and why in executor
    assert re.search(r'id="default-profile">host<', executor) and "unconfined" in executor  # the fallback, said
