"""Recording off (SANDSTORM_RECORDING_MAX_BYTES=0), through the /mcp application in-process: calls run and are audited
as ever, but no recording file is made; a call that printed says in its finished record and on its page that it was
not recorded because recording is off, the list offers no replay, /health and the console's home say recording is
off, and `audit_verify` finds nothing missing for the calls made meanwhile."""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.test import AsyncRequestFactory, Client
from pytest_django.fixtures import Settings as SettingsWrapper

from audit.models import KIND_FINISHED, AuditRecord
from audit.recordings import RECORDING_OFF, USAGE
from tests.inprocess import InProcessServer, new_token, serve_in_process, text_of

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

CHANGELIST = "/admin/audit/auditrecord/"


@pytest.fixture(autouse=True)
def _usage_measured_afresh() -> Iterator[None]:
    USAGE.reset()  # the recordings' size is measured again in this test's directory
    yield
    USAGE.reset()


@pytest.fixture(autouse=True)
def recordings_dir(tmp_path: Path, settings: SettingsWrapper) -> Path:
    settings.RECORDINGS_DIR = tmp_path / "recordings"
    return settings.RECORDINGS_DIR


@pytest.fixture
async def recording_off(tmp_path: Path, transactional_db: None) -> AsyncIterator[InProcessServer]:
    async with serve_in_process(tmp_path / "workspace", RECORDING_MAX_BYTES=0) as app:
        yield app


async def run(app: InProcessServer, token: str, command: str) -> AuditRecord:
    """Run `command` with terminal_exec; its finished record."""
    result = await app.call_tool(token, "terminal_exec", {"command": command})
    assert not result.get("isError"), text_of(result)
    started = [
        record for record in await records(kind="call.started") if (record.arguments or {}).get("command") == command
    ]
    [finished] = await records(kind=KIND_FINISHED, call_id=started[-1].call_id)
    return finished


def recording_of(finished: AuditRecord) -> Any:
    """What the finished record says of the call's recording (None: nothing)."""
    return (finished.detail or {}).get("recording")


@sync_to_async
def records(**filters: Any) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(**filters).order_by("id"))


def files_in(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()] if directory.exists() else []


async def health() -> dict[str, Any]:
    from mcpserver.health import health as health_view

    response = await health_view(AsyncRequestFactory().get("/health"))
    return dict(json.loads(response.content))


def verify() -> str:
    out = io.StringIO()
    call_command("audit_verify", stdout=out, stderr=io.StringIO())  # raises CommandError (exit 1) on any problem
    return out.getvalue()


async def test_with_recording_off_a_command_runs_and_its_record_says_it_was_not_recorded(
    recording_off: InProcessServer, recordings_dir: Path
) -> None:
    token = await new_token("recording-off")
    printed = await run(recording_off, token, "echo hello from an unrecorded call")
    assert "hello from an unrecorded call" in printed.result_excerpt  # audited as ever
    assert recording_of(printed) == {"unrecorded": RECORDING_OFF}
    silent = await run(recording_off, token, "true")
    assert recording_of(silent) is None  # printed nothing: nothing to say, as with recording on
    assert files_in(recordings_dir) == []


async def test_a_call_made_with_recording_off_says_so_on_its_page_and_offers_no_replay(
    recording_off: InProcessServer, admin_client: Client
) -> None:
    finished = await run(recording_off, await new_token("recording-off-page"), "echo not kept")
    [started] = await records(kind="call.started", call_id=finished.call_id)
    page = (await sync_to_async(admin_client.get)(f"{CHANGELIST}{started.pk}/change/")).content.decode()
    assert "Not recorded: recording is off (SANDSTORM_RECORDING_MAX_BYTES=0)." in page
    assert "recording-player" not in page and "recording.js" not in page and "Download .cast" not in page
    listed = (await sync_to_async(admin_client.get)(CHANGELIST)).content.decode()
    assert f"{CHANGELIST}{started.pk}/change/" in listed and "▶ replay" not in listed


async def test_health_and_the_home_say_recording_is_off(recording_off: InProcessServer, admin_client: Client) -> None:
    section = (await health())["recordings"]
    assert section["on"] is False and section["full"] is False
    home = (await sync_to_async(admin_client.get)("/admin/")).content.decode()
    found = re.search(r'<p id="status-recordings">(.*?)</p>', home, re.S)
    assert found is not None
    line = found.group(1)
    assert "recording is off" in line and "SANDSTORM_RECORDING_MAX_BYTES=0" in line
    assert 'class="badge ok">recording<' not in line


async def test_audit_verify_finds_nothing_missing_across_calls_recorded_and_made_while_recording_was_off(
    tmp_path: Path, recordings_dir: Path, transactional_db: None
) -> None:
    token = await new_token("recording-on-then-off")
    async with serve_in_process(tmp_path / "workspace") as recording_on:
        kept = await run(recording_on, token, "echo kept")
        assert (await health())["recordings"]["on"] is True
    async with serve_in_process(tmp_path / "workspace", RECORDING_MAX_BYTES=0) as off:
        unkept = await run(off, token, "echo not kept")
    assert "name" in recording_of(kept) and recording_of(unkept) == {"unrecorded": RECORDING_OFF}
    assert [path.name for path in files_in(recordings_dir)] == [f"{kept.call_id}.jsonl.gz"]
    assert (await sync_to_async(verify)()).startswith("OK:")
