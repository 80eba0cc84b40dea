"""Recordings on disk (audit/recordings.py): written as events come and readable meanwhile, described for the finished
record with their SHA-256, kept out of other users' reach, left unrecorded at the budget, found damaged, exported as
asciicast v2, and removed with the records a prune removes."""

from __future__ import annotations

import gzip
import io
import json
import stat
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import call_command
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper

from audit import recordings
from audit.log import Actor, call_finished, call_started, event
from audit.recording_cast import cast_lines
from audit.recordings import USAGE, Recording, damaged, live_text, read

EVENTS = [(0.01, "o", "a\n"), (0.5, "e", "oops\n"), (0.9, "o", "\x1b[31mred\x1b[0m\n")]


@pytest.fixture(autouse=True)
def directory(settings: SettingsWrapper, tmp_path: Path) -> Iterator[Path]:
    settings.RECORDINGS_DIR = tmp_path / "recordings"
    settings.RECORDINGS_MAX_BYTES = 0
    USAGE.reset()  # measured afresh for this directory
    yield settings.RECORDINGS_DIR
    USAGE.reset()


def call_id() -> str:
    return uuid.uuid4().hex


def test_a_recording_is_written_as_events_come_readable_meanwhile_and_described_with_its_sha256() -> None:
    recording = Recording(call_id(), "terminal_exec", started=1_700_000_000.0)
    assert recording.close() is None  # nothing printed: no file at all
    recording = Recording(call_id(), "terminal_exec", started=1_700_000_000.0)
    recording.write(EVENTS[:2])
    header, events = read(recording.path)  # while the call runs
    assert header["tool"] == "terminal_exec" and header["started"] == 1_700_000_000.0 and events == EVENTS[:2]
    recording.write(EVENTS[2:])
    described = recording.close()
    assert described is not None and described["name"] == f"2023-11-14/{recording.call_id}.jsonl.gz"
    assert described["sha256"] == recordings.file_sha256(recording.path) and described["events"] == 3
    assert described["output_bytes"] == sum(len(text.encode()) for _, _, text in EVENTS) and not described["cut"]
    assert read(recording.path)[1] == EVENTS
    assert stat.S_IMODE(recording.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(recording.path.parent.stat().st_mode) == 0o700
    assert damaged({"recording": described}) is None


def test_a_note_of_output_left_out_marks_the_recording_cut() -> None:
    recording = Recording(call_id(), "terminal_exec")
    recording.write([(0.1, "o", "head\n"), (0.2, "m", "[100 bytes of output left out here]"), (0.3, "o", "tail\n")])
    described = recording.close()
    assert described is not None and described["cut"]
    assert live_text(read(recording.path)[1]) == "head\n\n[100 bytes of output left out here]\ntail\n"


def test_a_full_budget_leaves_a_call_unrecorded_and_a_recording_that_meets_it_says_where_it_stopped(
    settings: SettingsWrapper,
) -> None:
    settings.RECORDINGS_MAX_BYTES = 1
    first = Recording(call_id(), "terminal_exec")
    first.write([(0.1, "o", "fits\n")])  # the budget was not met yet when it began
    first.write([(0.2, "o", "does not\n")])
    described = first.close()
    assert described is not None and described["unrecorded"] == recordings.BUDGET_FULL and described["cut"]
    assert [text for _, _, text in read(first.path)[1]] == ["fits\n", f"[{recordings.BUDGET_FULL}]"]
    second = Recording(call_id(), "terminal_exec")
    second.write([(0.1, "o", "anything\n")])
    assert second.close() == {"unrecorded": recordings.BUDGET_FULL}
    assert not second.path.exists()


def test_a_recording_changed_cut_short_or_missing_is_found(directory: Path) -> None:
    recording = Recording(call_id(), "terminal_exec")
    recording.write(EVENTS)
    described = recording.close()
    assert described is not None
    detail = {"recording": described}
    original = recording.path.read_bytes()
    recording.path.write_bytes(original[:-4])
    assert "does not match its SHA-256" in str(damaged(detail))
    recording.path.unlink()
    assert "is missing" in str(damaged(detail))
    assert "not a recording's" in str(damaged({"recording": {**described, "name": "../../etc/passwd"}}))
    assert damaged({"recording": {"unrecorded": "full"}}) is None and damaged(None) is None


def test_a_recording_cannot_be_made_twice_for_one_call() -> None:
    same = call_id()
    first = Recording(same, "terminal_exec")
    first.write(EVENTS)
    second = Recording(same, "terminal_exec")
    second.write(EVENTS)  # never over the first's file
    assert (second.close() or {}).get("unrecorded", "").startswith("the recording could not be created")
    assert first.close() is not None and read(first.path)[1] == EVENTS


def test_not_a_call_id_is_refused() -> None:
    with pytest.raises(ValueError):
        Recording("../../x", "terminal_exec")


def test_the_asciicast_export_is_v2_with_terminal_line_ends_and_our_notes_dimmed() -> None:
    header = {"version": 1, "started": 1_700_000_000.5, "tool": "terminal_exec", "pty": False}
    lines = [json.loads(line) for line in cast_lines(header, [*EVENTS, (1.0, "m", "[cut]")], "terminal_exec: x")]
    assert lines[0] == {"version": 2, "width": 160, "height": 40, "title": "terminal_exec: x", "timestamp": 1700000000}
    assert lines[1:4] == [[0.01, "o", "a\r\n"], [0.5, "o", "oops\r\n"], [0.9, "o", "\x1b[31mred\x1b[0m\r\n"]]
    assert lines[4] == [1.0, "o", "\r\n\x1b[2m[cut]\x1b[0m\r\n"]


@pytest.mark.django_db
def test_a_prune_removes_the_recordings_of_the_calls_it_removes_and_keeps_the_rest(directory: Path) -> None:
    actor = Actor(username="alice", credential_kind="bearer", credential_id="1")
    paths = []
    for days_ago in (30, 0):
        moment = timezone.now() - timedelta(days=days_ago)
        with mock.patch("django.utils.timezone.now", return_value=moment):
            started = call_started(actor, "terminal_exec", {"command": "echo"}, "test")
            recording = Recording(started.call_id, "terminal_exec", started.created_at.timestamp())
            recording.write(EVENTS)
            call_finished(started, "ok", result_text="a", recording=recording.close())
        paths.append(recording.path)
    event("test.newest")
    day = (timezone.now() - timedelta(days=10)).date().isoformat()
    out = io.StringIO()
    call_command("audit_prune", "--before", day, "--yes", stdout=out, stderr=io.StringIO())
    assert "and 1 recordings of their calls" in out.getvalue()
    assert not paths[0].exists() and not paths[0].parent.exists() and paths[1].exists()
    verified = io.StringIO()
    call_command("audit_verify", stdout=verified, stderr=io.StringIO())
    assert verified.getvalue().startswith("OK:")
    with gzip.open(paths[1], "rt") as stream:
        assert json.loads(stream.readline())["tool"] == "terminal_exec"


def test_a_backup_copies_the_recordings_it_needs_once_and_drops_those_pruned_since(tmp_path: Path) -> None:
    kept, pruned = Recording(call_id(), "terminal_exec"), Recording(call_id(), "terminal_exec")
    for recording in (kept, pruned):
        recording.write(EVENTS)
        recording.close()
    backup = tmp_path / "copy.sqlite3.recordings"
    assert recordings.copy_into([kept.name, pruned.name, "../../etc/passwd"], backup) == (2, 2)
    assert (backup / kept.name).read_bytes() == kept.path.read_bytes()
    assert stat.S_IMODE((backup / kept.name).stat().st_mode) == 0o600
    assert recordings.copy_into([kept.name, pruned.name], backup) == (0, 2)  # the next night: nothing new
    assert recordings.copy_into([kept.name], backup) == (0, 1)
    assert not (backup / pruned.name).exists() and (backup / kept.name).exists()
