"""The audit log's commands: audit_verify on intact and tampered chains, audit_prune, audit_export."""

from __future__ import annotations

import csv
import dataclasses
import getpass
import hashlib
import hmac
import io
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit import log
from audit.log import Actor, call_finished, call_started, event
from audit.log.append import append_all
from audit.models import KIND_EVENT, AuditRecord, ChainCheckpoint, ChainHead
from bench.seed import seed
from tests.database import copy_server_database
from tests.live import LiveServer, mcp_client

OK_LINE = re.compile(r"^OK: (\d+) records checked, chain intact \(head: record (\d+)\)$", re.MULTILINE)


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- a chain written by real tool calls through the shared live server --------------------------------------------


@pytest.fixture(scope="module")
def marker(live_server: LiveServer) -> str:
    """Make a few real tool calls through the MCP client; returns the marker their arguments carry."""
    marker = uuid.uuid4().hex

    async def calls() -> None:
        async with mcp_client(live_server.mcp_url, live_server.token) as client:
            await client.call_tool("workspace_info", {})
            await client.call_tool("file_write", {"path": f"audit-{marker}.txt", "content": marker})
            await client.call_tool("file_read", {"path": f"audit-{marker}.txt"})
            await client.call_tool("terminal_exec", {"command": f"echo {marker}"})

    anyio.run(calls)
    return marker


def snapshot(server: LiveServer, root: Path) -> LiveServer:
    """A copy of `server`'s state (database and audit key), for manage.py to run against and a test to tamper with."""
    state = root / "state"
    state.mkdir(parents=True)
    for name in ("audit_key", "secret_key"):
        if (server.state_dir / name).exists():
            shutil.copy2(server.state_dir / name, state / name)
    copy = copy_server_database(server.env, state)  # a consistent copy while the server runs
    return dataclasses.replace(server, root=root, process=None, env={**server.env, **copy})


@pytest.fixture
def server_copy(live_server: LiveServer, marker: str, tmp_path: Path) -> LiveServer:
    return snapshot(live_server, tmp_path)


def record_ids(server: LiveServer) -> list[int]:
    return [row["id"] for row in server.database.query("SELECT id FROM audit_auditrecord ORDER BY id")]


def tamper(server: LiveServer, sql: str, *params: Any) -> None:
    server.database.execute((sql, params))


def swap_contents(server: LiveServer, first: int, second: int) -> None:
    """Exchange every column but the id between two records, mac and prev_mac included."""
    columns = [column for column in server.database.columns("audit_auditrecord") if column != "id"]
    # Within the database, so every value keeps its type (JSON stays JSON on PostgreSQL).
    assignments = ", ".join(f"{column} = other.{column}" for column in columns)
    swap = f"UPDATE audit_auditrecord SET {assignments} FROM audit_swap AS other WHERE audit_auditrecord.id = %s AND other.id = %s"
    server.database.execute(
        ("CREATE TEMPORARY TABLE audit_swap AS SELECT * FROM audit_auditrecord WHERE id IN (%s, %s)", (first, second)),
        # started_id is unique: clear both before either takes the other's.
        ("UPDATE audit_auditrecord SET started_id = NULL WHERE id IN (%s, %s)", (first, second)),
        (swap, (first, second)),
        (swap, (second, first)),
    )


def assert_verify_fails_at(server: LiveServer, record_id: int) -> str:
    result = server.manage("audit_verify", check=False)
    assert result.returncode != 0, result.stdout
    assert f"FAILED: record {record_id}:" in result.stderr, result.stderr
    return result.stderr


@pytest.mark.live
def test_audit_verify_passes_on_the_chain_written_by_real_tool_calls(live_server: LiveServer, marker: str) -> None:
    result = live_server.manage("audit_verify")
    match = OK_LINE.search(result.stdout)
    assert match, result.stdout
    assert int(match.group(1)) >= 8  # four calls, two records each, and more from the rest of the session


@pytest.mark.live
def test_audit_verify_names_an_edited_record(server_copy: LiveServer) -> None:
    ids = record_ids(server_copy)
    middle = ids[len(ids) // 2]
    tamper(
        server_copy, "UPDATE audit_auditrecord SET reason = reason || ' (edited)', username = 'x' WHERE id = %s", middle
    )
    assert "edited" in assert_verify_fails_at(server_copy, middle)


@pytest.mark.live
def test_audit_verify_names_the_record_after_a_deleted_one(server_copy: LiveServer) -> None:
    ids = record_ids(server_copy)
    index = len(ids) // 2
    tamper(server_copy, "DELETE FROM audit_auditrecord WHERE id = %s", ids[index])
    message = assert_verify_fails_at(server_copy, ids[index + 1])
    assert f"record {ids[index - 1]}" in message and "deleted" in message


@pytest.mark.live
def test_audit_verify_notices_the_newest_record_was_deleted_through_the_chain_head(server_copy: LiveServer) -> None:
    ids = record_ids(server_copy)
    tamper(server_copy, "DELETE FROM audit_auditrecord WHERE id = %s", ids[-1])
    assert "chain head" in assert_verify_fails_at(server_copy, ids[-1])


@pytest.mark.live
def test_audit_verify_names_the_first_of_two_swapped_records(server_copy: LiveServer) -> None:
    ids = record_ids(server_copy)
    first, second = ids[len(ids) // 3], ids[len(ids) // 3 + 2]
    swap_contents(server_copy, first, second)
    assert_verify_fails_at(server_copy, first)


@pytest.mark.live
def test_audit_export_jsonl_has_one_parseable_line_per_call_with_started_and_finished_data(
    live_server: LiveServer, marker: str
) -> None:
    result = live_server.manage("audit_export", "--format", "jsonl")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows and all("tool" in row for row in rows)
    (echo,) = [row for row in rows if row["tool"] == "terminal_exec" and marker in json.dumps(row["arguments"])]
    assert echo["arguments"]["command"] == f"echo {marker}"
    assert echo["outcome"] == "ok" and echo["exit_code"] == 0 and marker in echo["result_excerpt"]
    assert echo["started_at"] <= echo["finished_at"]
    assert echo["credential_kind"] and echo["call_id"]
    finished = live_server.database.query(
        "SELECT duration_ms FROM audit_auditrecord WHERE call_id = %s AND kind = 'call.finished'", echo["call_id"]
    )
    assert [echo["duration_ms"]] == [row["duration_ms"] for row in finished]  # the finished record's, not a default
    assert "Exported" in result.stderr


# --- commands run in-process against the test database ------------------------------------------------------------


def old_event(name: str, days_ago: float) -> AuditRecord:
    """An event appended to the chain now, with a creation time in the past (as a slow clock would write it)."""
    record = AuditRecord(kind=KIND_EVENT, event=name, created_at=timezone.now() - timedelta(days=days_ago))
    append_all([record])
    return record


@pytest.mark.django_db
def test_audit_verify_passes_on_an_empty_log() -> None:
    out, _ = run("audit_verify")
    assert out.startswith("OK: 0 records checked, chain intact")


@pytest.mark.django_db
def test_audit_prune_removes_records_before_the_date_and_audit_verify_still_passes() -> None:
    seed(400)
    day = (timezone.now() - timedelta(days=15)).date()
    before = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    doomed = AuditRecord.objects.filter(created_at__lt=before).count()
    assert 0 < doomed < 400
    out, _ = run("audit_prune", "--before", day.isoformat(), "--yes")
    assert f"Pruned {doomed} records" in out
    assert not AuditRecord.objects.filter(created_at__lt=before).exists()
    checkpoint = ChainCheckpoint.objects.get()
    first = AuditRecord.objects.order_by("id").first()
    assert first is not None and first.prev_mac == checkpoint.last_pruned_mac and first.id > checkpoint.last_pruned_id
    assert checkpoint.records_pruned == doomed and checkpoint.pruned_before == before
    pruned = AuditRecord.objects.order_by("-id").first()
    assert pruned is not None and pruned.event == "audit.pruned"
    detail = pruned.detail
    assert isinstance(detail, dict), detail
    assert detail["count"] == doomed and detail["before"] == day.isoformat()
    assert detail["by"] == getpass.getuser() == pruned.username
    out, _ = run("audit_verify")
    match = OK_LINE.search(out)
    assert match is not None and match.groups() == (str(400 - doomed + 1), str(pruned.id))
    again, _ = run("audit_prune", "--before", day.isoformat(), "--yes")
    assert again.startswith("Nothing to prune")


@pytest.mark.django_db
def test_audit_prune_without_yes_is_a_dry_run_that_changes_nothing() -> None:
    seed(100)
    day = (timezone.now() - timedelta(days=10)).date().isoformat()
    before = list(AuditRecord.objects.values_list("id", "mac"))
    out, _ = run("audit_prune", "--before", day)
    assert out.startswith("Dry run: would remove") and "Nothing was removed" in out
    assert list(AuditRecord.objects.values_list("id", "mac")) == before
    assert not ChainCheckpoint.objects.exists()


@pytest.mark.django_db
def test_audit_prune_never_removes_the_newest_record_even_when_all_are_older() -> None:
    for days_ago in (9, 8, 7):
        old_event("old", days_ago)
    newest = AuditRecord.objects.order_by("-id").first()
    run("audit_prune", "--before", timezone.now().date().isoformat(), "--yes")
    assert list(AuditRecord.objects.order_by("id").values_list("event", flat=True)) == ["old", "audit.pruned"]
    assert newest is not None and AuditRecord.objects.filter(pk=newest.pk).exists()
    assert OK_LINE.search(run("audit_verify")[0])


@pytest.mark.django_db
def test_audit_prune_refuses_a_date_in_the_future_or_not_a_date() -> None:
    old_event("old", 3)
    tomorrow = (timezone.now().date() + timedelta(days=1)).isoformat()
    with pytest.raises(CommandError, match="in the future"):
        run("audit_prune", "--before", tomorrow, "--yes")
    with pytest.raises(CommandError, match="YYYY-MM-DD"):
        run("audit_prune", "--before", "last week", "--yes")
    assert AuditRecord.objects.count() == 1


@pytest.mark.django_db
def test_audit_prune_refuses_a_chain_that_does_not_verify() -> None:
    for days_ago in (9, 8, 7):
        old_event("old", days_ago)
    oldest = AuditRecord.objects.order_by("id")[0]
    AuditRecord.objects.filter(pk=oldest.pk).update(event="forged")
    with pytest.raises(CommandError, match="does not verify"):
        run("audit_prune", "--before", timezone.now().date().isoformat(), "--yes")
    assert AuditRecord.objects.count() == 3


def one_call(username: str, command: str, result: str) -> None:
    actor = Actor(username=username, credential_kind="bearer", credential_id="1", credential_name="laptop")
    started = call_started(actor, "terminal_exec", {"command": command}, "test")
    call_finished(started, "ok", result_text=result, exit_code=0, duration_ms=5)


@pytest.mark.django_db
def test_audit_export_csv_has_a_header_and_neutralised_formulas() -> None:
    one_call("=cmd|' /C calc'!A0", '=HYPERLINK("http://evil")', "@SUM(1+1)")
    out, _ = run("audit_export", "--format", "csv")
    header, row = list(csv.reader(io.StringIO(out)))
    assert header[:2] == ["call_id", "tool"] and "result_excerpt" in header
    cells = dict(zip(header, row, strict=True))
    assert cells["tool"] == "terminal_exec" and cells["outcome"] == "ok" and cells["exit_code"] == "0"
    assert cells["user"] == "'=cmd|' /C calc'!A0"
    assert cells["command"] == '\'=HYPERLINK("http://evil")'
    assert cells["result_excerpt"] == "'@SUM(1+1)"


def seeded_calls() -> Iterator[tuple[str, date]]:
    for call_id, created in AuditRecord.objects.filter(kind="call.started").values_list("call_id", "created_at"):
        yield call_id, created.date()


@pytest.mark.django_db
def test_audit_export_since_and_until_keep_calls_started_within_those_days() -> None:
    seed(300)
    since, until = (timezone.now() - timedelta(days=20)).date(), (timezone.now() - timedelta(days=10)).date()
    expected = {call_id for call_id, day in seeded_calls() if since <= day <= until}
    out, _ = run("audit_export", "--format", "jsonl", "--since", since.isoformat(), "--until", until.isoformat())
    rows = [json.loads(line) for line in out.splitlines()]
    assert {row["call_id"] for row in rows} == expected and 0 < len(expected) < 150
    assert all(since.isoformat() <= row["started_at"][:10] <= until.isoformat() for row in rows)


@pytest.mark.django_db
def test_audit_export_output_writes_a_file_only_its_owner_can_read(tmp_path: Path) -> None:
    one_call("alice", "ls", "a.txt")
    path = tmp_path / "calls.jsonl"
    path.write_text("old, world-readable\n")
    os.chmod(path, 0o644)
    out, err = run("audit_export", "--format", "jsonl", "--output", str(path))
    assert out == "" and f"to {path}" in err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["tool"] == "terminal_exec" and row["result_excerpt"] == "a.txt"
    assert [entry.name for entry in tmp_path.iterdir()] == ["calls.jsonl"]  # no temporary file left behind


# --- the canonical form the macs are computed over ----------------------------------------------------------------

TRICKY = 'quote " backslash \\ newline \n tab \t nul \x00 bell \x07 del \x7f é ☃ 😀 \u2028 </script>'


def reference_bytes(values: list[Any], prev_mac: str) -> bytes:
    """The canonical form as first written: json.dumps of the whole dict, sorted keys (encoding.py must match it)."""

    def canonical(value: Any) -> Any:
        return value.astimezone(UTC).isoformat(timespec="microseconds") if isinstance(value, datetime) else value

    content = dict(zip(log.CHAINED_FIELDS, (canonical(value) for value in values), strict=True))
    content["prev_mac"] = prev_mac
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def test_the_precomputed_mac_gives_what_hmac_new_gives_for_short_and_long_keys() -> None:
    for key in (b"", b"k", b"k" * 64, b"k" * 65, os.urandom(68)):
        keyed = log.Mac(key)
        for message in (b"", b"x", os.urandom(700), os.urandom(5000)):
            assert keyed.hexdigest(message) == hmac.new(key, message, hashlib.sha256).hexdigest()


def test_canonical_bytes_match_the_json_dumps_form_for_every_kind_of_value() -> None:
    values: list[Any] = [f"value {index} {TRICKY}" for index in range(len(log.CHAINED_FIELDS))]
    values[log.CHAINED_FIELDS.index("created_at")] = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    values[log.CHAINED_FIELDS.index("arguments")] = {"z": [1, 2.5, None, True], "a": {"y": TRICKY, "b": -3}}
    values[log.CHAINED_FIELDS.index("detail")] = None
    values[log.CHAINED_FIELDS.index("exit_code")] = -9
    values[log.CHAINED_FIELDS.index("duration_ms")] = 2**40
    assert log.canonical_bytes(values, "ab" * 32) == reference_bytes(values, "ab" * 32)
    values[log.CHAINED_FIELDS.index("username")] = 12  # a text field holding something else is still json.dumps'd
    values[log.CHAINED_FIELDS.index("reason")] = None
    assert log.canonical_bytes(values, "ab" * 32) == reference_bytes(values, "ab" * 32)


@pytest.mark.django_db
def test_audit_verify_reads_awkward_text_back_as_it_was_appended() -> None:
    actor = Actor(username=TRICKY, user_agent=TRICKY, user_id=7)
    started = call_started(actor, "terminal_exec", {"command": TRICKY, "b": {"z": 1, "a": [TRICKY]}}, "test")
    call_finished(started, "error", result_text=TRICKY, exit_code=-1, duration_ms=0)
    event("odd", actor, detail=TRICKY, number=1.5)
    result = log.verify()
    assert result.ok and result.checked == 3


@pytest.mark.django_db
def test_audit_verify_walks_on_to_records_appended_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    event("before")
    appended: list[AuditRecord] = []
    real_head = log.chain_head

    def head_after_one_more_record() -> tuple[str, int]:
        if not appended:
            appended.append(event("during"))
        return real_head()

    monkeypatch.setattr(log.chain, "chain_head", head_after_one_more_record)
    result = log.verify()
    assert result.ok and result.checked == 2 and result.last_id == appended[0].id


@pytest.mark.django_db
def test_audit_verify_reports_a_missing_chain_head() -> None:
    event("one")
    event("two")
    ChainHead.objects.all().delete()
    with pytest.raises(CommandError, match="chain head is missing"):
        run("audit_verify")
