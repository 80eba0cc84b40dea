"""The chain head anchored outside the database: audit_verify notices records cut off the end of the chain (or the
whole log deleted) against the anchor file, while a prune still verifies and a forged anchor line is refused."""

from __future__ import annotations

import io
import multiprocessing
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections
from django.utils import timezone

from audit import log
from audit.anchor import anchor_line, append_anchor, read_anchors
from audit.log import event
from audit.log.append import append_all
from audit.models import KIND_EVENT, AuditRecord, ChainCheckpoint, ChainHead
from mcpserver.lifespan import log_chain_head
from tests.live import LiveServer


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def events(count: int, days_ago: float = 0) -> list[AuditRecord]:
    records = [
        AuditRecord(kind=KIND_EVENT, event=f"e{number}", created_at=timezone.now() - timedelta(days=days_ago))
        for number in range(count)
    ]
    append_all(records)
    return records


def rewind_head_to(record: AuditRecord) -> None:
    """What someone with write access to the database does to hide the newest records: delete them, set the head
    back to the last one kept. The shorter chain is intact on its own."""
    AuditRecord.objects.filter(id__gt=record.id).delete()
    ChainHead.objects.filter(pk=1).update(mac=record.mac, last_record_id=record.id)


@pytest.mark.django_db
def test_deleting_the_newest_records_and_rewinding_the_head_fails_against_the_anchor() -> None:
    records = events(10)
    log_chain_head()  # the server's minute tick
    rewind_head_to(records[6])
    assert log.verify().ok  # the chain alone cannot tell
    with pytest.raises(
        CommandError, match=r"FAILED: 3 records missing after the last anchor: the chain ends at record"
    ):
        run("audit_verify")


@pytest.mark.django_db
def test_deleting_the_whole_log_fails_against_the_anchor() -> None:
    records = events(5)
    log_chain_head()
    AuditRecord.objects.all().delete()
    ChainHead.objects.all().delete()
    ChainCheckpoint.objects.all().delete()
    assert log.verify().ok
    with pytest.raises(CommandError, match=f"{records[-1].id} records missing after the last anchor"):
        run("audit_verify")


@pytest.mark.django_db
def test_newest_records_replaced_by_new_ones_with_the_same_ids_fail_against_the_anchor() -> None:
    records = events(4)
    log_chain_head()
    rewind_head_to(records[1])
    event("written after the rewind")
    event("and another")  # SQLite gives the deleted ids out again
    with pytest.raises(CommandError, match="anchored record (is gone|has another mac)"):
        run("audit_verify")


@pytest.mark.django_db
def test_a_prune_of_anchored_records_still_verifies() -> None:
    old = events(6, days_ago=30)
    log_chain_head()  # anchors old[-1], which the prune below removes
    events(3)
    day = (timezone.now() - timedelta(days=1)).date().isoformat()
    out, _ = run("audit_prune", "--before", day, "--yes")
    assert "Pruned" in out and not AuditRecord.objects.filter(id=old[-1].id).exists()
    out, err = run("audit_verify")
    assert out.startswith("OK: ") and "reaches the last anchor" in err


@pytest.mark.django_db
def test_a_forged_or_edited_anchor_line_fails_and_a_torn_last_line_is_ignored() -> None:
    records = events(3)
    log_chain_head()
    path: Path = settings.AUDIT_ANCHOR_FILE
    assert run("audit_verify")[0].startswith("OK: ")
    with path.open("a") as file:
        file.write(anchor_line(b"not the audit key", records[-1].id + 50, "f" * 64, timezone.now()))
    with pytest.raises(CommandError, match="line 2 of .* is not an anchor written with this audit key"):
        run("audit_verify")
    path.write_text(path.read_text().splitlines(keepends=True)[0] + "v1 2026-01-01T00:00:00+00:00 99")
    assert run("audit_verify")[0].startswith("OK: ")


@pytest.mark.django_db
def test_without_an_anchor_file_verify_passes_and_says_so() -> None:
    events(2)
    out, err = run("audit_verify")
    assert out.startswith("OK: ") and "No anchor yet" in err


def _append_many(path: str, key: bytes, start: int, count: int) -> None:
    for number in range(start, start + count):
        append_anchor(Path(path), key, number, f"{number:064x}")


def test_anchor_lines_of_processes_appending_at_once_never_interleave(tmp_path: Path) -> None:
    path, key, writers, each = tmp_path / "audit_anchors", b"k" * 32, 4, 150
    context = multiprocessing.get_context("fork")
    connections.close_all()
    processes = [context.Process(target=_append_many, args=(str(path), key, n * each, each)) for n in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * writers
    found = read_anchors(path, key)
    assert found is not None and not found.forged and not found.torn
    assert found.count == writers * each and found.newest is not None and found.newest.record_id == writers * each - 1
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.live
def test_a_running_server_anchors_its_chain_head_in_its_state_dir(live_server: LiveServer) -> None:
    anchors = live_server.state_dir / "audit_anchors"
    assert anchors.exists() and anchors.stat().st_mode & 0o777 == 0o600  # written at start
    result = live_server.manage("audit_verify")
    assert result.stdout.startswith("OK: ") and "last anchor" in result.stderr


@pytest.mark.django_db
def test_an_unchanged_head_is_not_anchored_again() -> None:
    events(2)
    log_chain_head()
    log_chain_head()
    event("one more")
    log_chain_head()
    found = read_anchors(settings.AUDIT_ANCHOR_FILE, settings.AUDIT_HMAC_KEY)
    assert found is not None and found.count == 2
