"""The call list's filters (audit.filters), one definition for the list, its exports and `audit_export`: several
values per parameter, "failed", exit codes ("nonzero"), date ranges in the current time zone, clear errors,
index-friendly queries."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.http import QueryDict
from django.test import Client
from django.utils import timezone

from audit.export import call_queryset, filter_calls
from audit.filters import FAILED_OUTCOMES, InvalidFilter, parse_filters
from audit.log import Actor
from audit.log.append import append_all
from audit.models import KIND_FINISHED, KIND_STARTED, OUTCOMES, AuditRecord
from tests.test_audit_admin import stream

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/audit/auditrecord/"
EXPORT_JSONL = "/admin/audit/auditrecord/export.jsonl"
EXPORT_CSV = "/admin/audit/auditrecord/export.csv"
NOW = datetime(2025, 6, 15, 10, 30, tzinfo=UTC)


def test_failed_stands_for_every_outcome_but_ok_and_pending() -> None:
    # "pending": the call was answered that it waits for an administrator's approval, which is no failure.
    assert set(FAILED_OUTCOMES) == set(OUTCOMES) - {"ok", "pending"}
    assert set(FAILED_OUTCOMES) == {"error", "timeout", "denied", "cancelled", "interrupted"}


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("range=today", "2025-06-15T00:00", "2025-06-16T00:00"),
        ("range=yesterday", "2025-06-14T00:00", "2025-06-15T00:00"),
        ("range=7d", "2025-06-09T00:00", "2025-06-16T00:00"),
        ("range=30d", "2025-05-17T00:00", "2025-06-16T00:00"),
        ("since=2025-06-01&until=2025-06-03", "2025-06-01T00:00", "2025-06-04T00:00"),
        ("since=2025-06-01&until=", "2025-06-01T00:00", None),  # an unfilled date input is no filter
        ("created_at__gte=2025-06-10T12:00:00%2B00:00", "2025-06-10T12:00", None),
        ("range=7d&since=2025-06-12", "2025-06-12T00:00", "2025-06-16T00:00"),  # they narrow together
    ],
)
def test_date_filters_are_whole_days_in_the_current_time_zone(query: str, start: str, end: str | None) -> None:
    filters = parse_filters(QueryDict(query), now=NOW)
    assert filters.start is not None and filters.start.astimezone(UTC).isoformat()[:16] == start
    assert (filters.end.astimezone(UTC).isoformat()[:16] if filters.end else None) == end


def test_yesterday_is_the_day_of_the_current_time_zone(settings: Any) -> None:
    settings.TIME_ZONE = "Pacific/Auckland"  # UTC+12 in June: 10:30 UTC is already 22:30 there
    with timezone.override("Pacific/Auckland"):
        filters = parse_filters(QueryDict("range=yesterday"), now=NOW)
    assert filters.start is not None and filters.end is not None
    assert (filters.start.isoformat(), filters.end.isoformat()) == (
        "2025-06-14T00:00:00+12:00",
        "2025-06-15T00:00:00+12:00",
    )


@pytest.mark.parametrize(
    ("query", "parameter", "words"),
    [
        ("range=tomorrow", "range", "not one of today, yesterday, 7d, 30d"),
        ("range=today&range=7d", "range", "takes one value"),
        ("since=01/06/2025", "since", "YYYY-MM-DD"),
        ("until=2025-02-30", "until", "YYYY-MM-DD"),
        ("since=2025-06-03&until=2025-06-01", "until", "before since"),
        ("outcome=ok&outcome=broken", "outcome", "'broken' is not one of failed, ok"),
        ("credential=laptop", "credential", "kind:id"),
        ("created_at__lt=soon", "created_at__lt", "not a date"),
        ("call_id=abc", "call_id", "no such filter"),
        ("exit_code=one", "exit_code", "'one' is not a whole number (such as 1 or 127) or nonzero"),
        ("exit_code=1&exit_code=1.5", "exit_code", "'1.5' is not a whole number"),
        ("exit_code=99999999999", "exit_code", "is not a whole number"),
        ("exit_code=NONZERO", "exit_code", "is not a whole number"),
    ],
)
def test_a_wrong_parameter_is_named_in_the_error(query: str, parameter: str, words: str) -> None:
    with pytest.raises(InvalidFilter) as raised:
        parse_filters(QueryDict(query), now=NOW)
    assert raised.value.parameter == parameter and words in raised.value.message


def make_call(tool: str, outcome: str | None, credential: str = "7", at: datetime | None = None,
              exit_code: int | None = None) -> AuditRecord:  # fmt: skip
    label = "laptop" if credential == "7" else "phone"
    actor = Actor(username="alice", credential_kind="bearer", credential_id=credential, credential_name=label)
    started = AuditRecord(kind=KIND_STARTED, created_at=at or timezone.now(), call_id=f"{tool}-{outcome}-{credential}",
                          tool=tool, arguments={"command": "true"},
                          **{name: getattr(actor, name) for name in ("username", "credential_kind", "credential_id", "credential_name")})  # fmt: skip
    append_all([started])
    if outcome is not None:
        append_all([AuditRecord(kind=KIND_FINISHED, created_at=started.created_at, call_id=started.call_id, started=started,
                                tool=tool, outcome=outcome, exit_code=exit_code)])  # fmt: skip
    return started


@pytest.fixture
def calls() -> dict[str, AuditRecord]:
    yesterday = timezone.now() - timedelta(days=1)
    return {
        "read-ok": make_call("file_read", "ok"),  # no exit code: not a command
        "exec-ok": make_call("terminal_exec", "ok", exit_code=0),
        "exec-error": make_call("terminal_exec", "error", exit_code=1),
        "exec-timeout": make_call("terminal_exec", "timeout", exit_code=124),
        "git-denied": make_call("git_status", "denied", credential="8"),
        "exec-cancelled-yesterday": make_call("terminal_exec", "cancelled", at=yesterday, exit_code=130),
        "exec-interrupted": make_call("terminal_exec", "interrupted", credential="8", exit_code=-1),
        "exec-running": make_call("terminal_exec", None),
    }


CASES = [
    ("outcome=failed", {"exec-error", "exec-timeout", "git-denied", "exec-cancelled-yesterday", "exec-interrupted"}),
    ("outcome=error&outcome=timeout", {"exec-error", "exec-timeout"}),
    ("outcome=ok&outcome=running", {"read-ok", "exec-ok", "exec-running"}),
    ("outcome=running", {"exec-running"}),
    ("tool=file_read&tool=git_status", {"read-ok", "git-denied"}),
    ("credential=bearer:8&outcome=failed", {"git-denied", "exec-interrupted"}),
    ("credential=bearer:7&credential=bearer:8&tool=git_status", {"git-denied"}),
    ("credential_name=phone&outcome=failed", {"git-denied", "exec-interrupted"}),  # a connected app's calls, by name
    ("outcome=failed&range=yesterday", {"exec-cancelled-yesterday"}),
    ("outcome=failed&range=today&tool=terminal_exec", {"exec-error", "exec-timeout", "exec-interrupted"}),
    ("tool=&outcome=&range=", None),  # an empty form: every call
    ("exit_code=1", {"exec-error"}),
    ("exit_code=1&exit_code=124", {"exec-error", "exec-timeout"}),
    ("exit_code=0", {"exec-ok"}),
    ("exit_code=-1", {"exec-interrupted"}),  # negative: the executor stopped waiting for a killed command
    ("exit_code=nonzero", {"exec-error", "exec-timeout", "exec-cancelled-yesterday", "exec-interrupted"}),
    ("exit_code=nonzero&exit_code=124", {"exec-error", "exec-timeout", "exec-cancelled-yesterday", "exec-interrupted"}),
    (
        "exit_code=0&exit_code=nonzero",
        {"exec-ok", "exec-error", "exec-timeout", "exec-cancelled-yesterday", "exec-interrupted"},
    ),  # fmt: skip
    ("exit_code=nonzero&credential=bearer:8&range=today", {"exec-interrupted"}),
    ("exit_code=1&outcome=timeout", set()),
    ("exit_code=", None),
]


@pytest.mark.parametrize(("query", "expected"), CASES)
def test_the_list_the_exports_and_audit_export_pick_the_same_calls(
    admin_client: Client, calls: dict[str, AuditRecord], query: str, expected: set[str] | None
) -> None:
    expected = set(calls) if expected is None else expected
    names = {record.pk: name for name, record in calls.items()}
    listed = admin_client.get(f"{CHANGELIST}?{query}")
    assert listed.status_code == 200
    assert {names[record.pk] for record in listed.context["cl"].result_list} == expected
    by_call_id = {record.call_id: name for name, record in calls.items()}
    exported = admin_client.get(f"{EXPORT_JSONL}?{query}")
    lines = stream(exported).splitlines()
    assert {by_call_id[json.loads(line)["call_id"]] for line in lines} == expected
    options: list[str] = []
    for name, values in QueryDict(query).lists():
        for value in values:
            options += [f"--{name.replace('_', '-')}", value] if value else []
    out = io.StringIO()
    call_command("audit_export", "--format", "jsonl", *options, stdout=out, stderr=io.StringIO())
    assert {by_call_id[json.loads(line)["call_id"]] for line in out.getvalue().splitlines()} == expected


def test_the_csv_export_and_audit_export_keep_the_exit_code_filter(
    admin_client: Client, calls: dict[str, AuditRecord]
) -> None:
    query = "exit_code=0&exit_code=nonzero&tool=terminal_exec"
    exported = list(csv.DictReader(io.StringIO(stream(admin_client.get(f"{EXPORT_CSV}?{query}")))))
    assert {row["exit_code"] for row in exported} == {"0", "1", "124", "130", "-1"}  # no call without one
    out = io.StringIO()
    call_command("audit_export", "--format", "csv", "--exit-code", "nonzero", "--exit-code", "0",
                 "--tool", "terminal_exec", stdout=out, stderr=io.StringIO())  # fmt: skip
    assert list(csv.DictReader(io.StringIO(out.getvalue()))) == exported


def test_audit_export_names_the_wrong_option() -> None:
    with pytest.raises(CommandError, match=r"--outcome: 'broken' is not one of failed"):
        call_command("audit_export", "--format", "jsonl", "--outcome", "broken", stdout=io.StringIO())
    with pytest.raises(CommandError, match=r"--exit-code: 'x' is not a whole number"):
        call_command("audit_export", "--format", "jsonl", "--exit-code", "x", stdout=io.StringIO())
    with pytest.raises(CommandError, match=r"--until: 2025-06-01 is before since"):
        call_command("audit_export", "--format", "jsonl", "--since", "2025-06-03", "--until", "2025-06-01")


def test_the_outcome_filter_names_the_finished_kind_and_one_in_over_its_outcomes() -> None:
    sql = str(filter_calls(call_queryset(), QueryDict("outcome=failed")).query).replace("'", "")
    # The partial (outcome, -id) index holds finished records only: the query must say so, and ask with one IN.
    assert 'T2."kind" = call.finished AND T2."outcome" IN (error, denied, timeout, cancelled, interrupted)' in sql
    assert " OR " not in sql and "COUNT(" not in sql.upper()


def test_the_exit_code_filter_names_the_finished_kind_and_one_in_over_its_codes() -> None:
    sql = str(filter_calls(call_queryset(), QueryDict("exit_code=124&exit_code=1")).query).replace("'", "")
    assert 'T2."kind" = call.finished AND T2."exit_code" IN (1, 124)' in sql
    nonzero = str(filter_calls(call_queryset(), QueryDict("exit_code=nonzero")).query).replace("'", "")
    assert '(T2."exit_code" < 0 OR T2."exit_code" > 0)' in nonzero and "COUNT(" not in nonzero.upper()


def test_the_exit_code_filter_walks_the_calls_newest_first_as_the_outcome_filter_does() -> None:
    # The list's page: started records read newest first from their index, each one's finished record looked up by
    # its unique started_id; never a scan of the table nor a sort of every match (no index holds the exit code).
    if connection.vendor != "sqlite":
        pytest.skip("the plan is SQLite's")
    plans = {}
    for query in ("outcome=error", "exit_code=1&exit_code=2", "exit_code=nonzero"):
        page = filter_calls(call_queryset(), QueryDict(query)).order_by("-id")[:101]
        sql, params = page.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            plans[query] = [row[-1] for row in cursor.fetchall()]
    for query, plan in plans.items():
        assert len(plan) == 2 and "USING INDEX audit_kind_id" in plan[0] and "(started_id=?)" in plan[1], (query, plan)
        assert not any("SCAN" in step or "TEMP B-TREE" in step for step in plan), (query, plan)
    assert plans["exit_code=1&exit_code=2"] == plans["outcome=error"]
