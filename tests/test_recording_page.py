"""A call's recording in the console, through Django's test client: the call page headed in words, with the player,
its search and the download link when the call has a recording (its scripts static files, the player vendored), in
words when it was not recorded or cut; the list's replay links; staff who may only view replay and download, other
staff get neither. The player and the search at work: tests/test_recording_player_browser.py."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.test import Client

from audit.log import Actor, call_finished, call_started
from audit.models import AuditRecord
from audit.recordings import Recording

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/audit/auditrecord/"
REPO = Path(__file__).resolve().parent.parent
VENDOR = "audit/vendor/asciinema-player"
LIVE_JS = REPO / "mcpserver/static/mcpserver/console_live.js"
RECORDING_JS = REPO / "audit/static/audit/recording.js"


@pytest.fixture(autouse=True)
def _recordings_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "RECORDINGS_DIR", tmp_path / "recordings")


def make_call(recording: dict[str, Any] | None, username: str = "alice", finished: bool = True) -> AuditRecord:
    who = Actor(user_id=1, username=username, credential_kind="bearer", credential_id="7", credential_name="laptop")
    started = call_started(who, "terminal_exec", {"command": "make test"}, "test-instance")
    if finished:
        call_finished(started, "ok", result_text="done", exit_code=0, duration_ms=1500, recording=recording)
    return started


def recorded_call() -> AuditRecord:
    """A call with a real recording file: two coloured lines a second apart."""
    started = make_call(None, finished=False)
    recording = Recording(started.call_id, started.tool, started.created_at.timestamp())
    recording.write([(0.1, "o", "\x1b[32mline 1\x1b[0m\n"), (1.1, "o", "line 2\n")])
    call_finished(started, "ok", result_text="done", exit_code=0, duration_ms=1500, recording=recording.close())
    return started


def call_page(client: Client, call: AuditRecord) -> str:
    response = client.get(f"{CHANGELIST}{call.pk}/change/")
    assert response.status_code == 200, response
    return response.content.decode()


def cast_url(call: AuditRecord) -> str:
    return f"/admin/audit/calls/{call.call_id}/recording.cast"


def viewer(client: Client, *codenames: str) -> User:
    user = User.objects.create_user("viewer", password="not-used-here", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return user


# --- the call page --------------------------------------------------------------------------------------------------


def test_a_call_page_is_headed_by_its_tool_caller_and_time_not_by_its_kind(admin_client: Client) -> None:
    call = make_call(None, username="alice")
    page = call_page(admin_client, call)
    when = f"{call.created_at:%Y-%m-%d %H:%M:%S} UTC"
    heading = re.search(r"<h1>(.*?)</h1>", page, re.S)
    assert heading is not None and heading.group(1) == f"terminal_exec by alice — {when}"
    assert "call.started" not in page
    assert f"<title>terminal_exec by alice — {when} |" in page


def test_a_recorded_call_page_has_the_player_its_search_and_the_download_link(admin_client: Client) -> None:
    call = recorded_call()
    page = call_page(admin_client, call)
    assert f'data-cast="{cast_url(call)}"' in page
    assert f'id="recording-download" href="{cast_url(call)}?download=1"' in page
    for part in ('id="recording-player"', 'id="recording-speed"', 'id="recording-query"', 'id="recording-hits"'):
        assert part in page, part
    assert f"{VENDOR}/asciinema-player.min.js" in page and f"{VENDOR}/asciinema-player.css" in page
    assert "audit/recording.js" in page
    assert "Not recorded" not in page and "Cut:" not in page


def test_the_call_page_runs_no_inline_script(admin_client: Client) -> None:
    page = call_page(admin_client, recorded_call())
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    assert scripts and all("src=" in attributes and not body.strip() for attributes, body in scripts), scripts


def test_a_call_left_unrecorded_says_why_and_has_no_player(admin_client: Client) -> None:
    page = call_page(admin_client, make_call({"unrecorded": "the recordings' disk budget is full"}))
    assert "Not recorded: the recordings&#x27; disk budget is full." in page
    assert "recording-player" not in page and "recording.js" not in page and "Download .cast" not in page


def test_a_recording_stopped_by_its_budget_plays_what_it_kept_and_says_where_it_stops(admin_client: Client) -> None:
    described = {"name": "2026-12-07/0123456789abcdef.jsonl.gz", "cut": True, "unrecorded": "the budget is full"}
    page = call_page(admin_client, make_call(described))
    assert "Not recorded: the budget is full. The recording below stops there." in page
    assert "recording-player" in page and "Cut: the middle" not in page


def test_a_recording_cut_at_the_cap_says_the_middle_was_left_out(admin_client: Client) -> None:
    page = call_page(admin_client, make_call({"name": "2026-12-07/0123456789abcdef.jsonl.gz", "cut": True}))
    assert 'id="recording-cut"' in page and "Cut: the middle was left out." in page
    assert "recording-player" in page


def test_a_call_that_printed_nothing_or_still_runs_has_no_recording_section(admin_client: Client) -> None:
    for call in (make_call(None), make_call(None, finished=False)):
        page = call_page(admin_client, call)
        assert 'id="recording"' not in page and "recording.js" not in page


# --- the list -------------------------------------------------------------------------------------------------------


def test_the_list_links_only_calls_with_a_recording_to_their_replay(admin_client: Client) -> None:
    recorded, unrecorded, silent = recorded_call(), make_call({"unrecorded": "full"}), make_call(None)
    page = admin_client.get(CHANGELIST).content.decode()
    assert all(f"{CHANGELIST}{call.pk}/change/" in page for call in (recorded, unrecorded, silent))  # all listed
    links = re.findall(r'<a class="audit-replay" href="([^"]+)"[^>]*>▶ replay</a>', page)
    assert links == [f"{CHANGELIST}{recorded.pk}/change/#recording"]


# --- who may replay -------------------------------------------------------------------------------------------------


def test_staff_who_may_only_view_the_audit_log_replay_and_download(client: Client) -> None:
    call = recorded_call()
    viewer(client, "view_auditrecord")
    assert "recording-player" in call_page(client, call)
    cast = client.get(f"{cast_url(call)}?download=1")
    assert cast.status_code == 200
    assert cast["Content-Disposition"] == f'attachment; filename="sandstorm-{call.call_id}.cast"'
    played = cast.content.decode()
    assert played.startswith('{"version": 2') and "line 1\\u001b[0m\\r\\n" in played and "line 2\\r\\n" in played


def test_staff_without_the_audit_view_permission_get_neither_the_page_nor_the_recording(client: Client) -> None:
    call = recorded_call()
    viewer(client, "view_bearertoken", "change_auditrecord")
    assert client.get(f"{CHANGELIST}{call.pk}/change/").status_code == 403
    assert client.get(cast_url(call)).status_code == 403
    assert client.get(f"{cast_url(call)}?download=1").status_code == 403


def test_a_call_is_found_by_its_id_for_the_live_view_only_by_staff_who_may_view_it(client: Client) -> None:
    """The Live view knows calls by id: /admin/audit/calls/<id>/ leads to the call's page, at its recording."""
    call = recorded_call()
    page = f"/admin/audit/calls/{call.call_id}/"
    assert client.get(page).status_code == 302 and "/login/" in client.get(page)["Location"]
    user = viewer(client, "view_bearertoken")
    assert client.get(page).status_code == 403
    user.user_permissions.set(Permission.objects.filter(codename="view_auditrecord"))
    answer = client.get(page)
    assert answer.status_code == 302 and answer["Location"] == f"{CHANGELIST}{call.pk}/change/#recording"
    assert client.get("/admin/audit/calls/0123456789abcdef/").status_code == 404
    assert client.get("/admin/audit/calls/not-a-call/").status_code == 404


# --- the player's files ---------------------------------------------------------------------------------------------


def test_the_vendored_player_is_served_and_is_the_one_its_readme_names() -> None:
    readme = (REPO / "audit/static" / VENDOR / "README.md").read_text()
    sums = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M))
    assert set(sums) == {"asciinema-player.min.js", "asciinema-player.css", "LICENSE"}
    for name, digest in sums.items():
        found = finders.find(f"{VENDOR}/{name}")  # what the server's static files handler looks up
        assert isinstance(found, str), name
        assert hashlib.sha256(Path(found).read_bytes()).hexdigest() == digest, name
    assert finders.find("audit/recording.js")


def test_the_search_spells_out_the_characters_the_live_view_spells_out() -> None:
    def hidden(path: Path) -> str:
        match = re.search(r"const HIDDEN =\s*(/.*?/gu);", path.read_text(), re.S)
        assert match is not None, path
        return match.group(1)

    assert hidden(RECORDING_JS) == hidden(LIVE_JS)


def test_the_agents_description_of_its_command_is_shown_as_its_words_escaped(admin_client: Client) -> None:
    who = Actor(user_id=1, username="alice", credential_kind="bearer", credential_id="7", credential_name="laptop")
    said = "runs the tests <script>alert(1)</script>\u202e reversed"
    started = call_started(who, "terminal_exec", {"command": "make test", "description": said}, "test-instance")
    page = call_page(admin_client, started)
    line = re.search(r'<p id="call-description"[^>]*>(.*?)</p>', page, re.S)
    assert line is not None and "The agent says:" in line[1]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in line[1] and "<script>alert" not in line[1]
    assert "\u27eaU+202E\u27eb" in line[1]  # the hidden character spelled out
    assert 'id="call-description"' not in call_page(admin_client, make_call(None))
