"""Security events as sentences (audit.event_sentences): every event the code writes has one, the command line is
named as such, everything agent- or client-written is escaped, and an unknown event still reads as a line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from audit.event_sentences import SENTENCES, event_sentence
from audit.log import Actor, event
from audit.models import KIND_EVENT, AuditRecord

ROOT = Path(__file__).resolve().parent.parent
# `event("name"` and `aevent(\n "name"`, as the code writes its events
WRITTEN = re.compile(r"\ba?event\(\s*\"([a-z_]+\.[a-z_.]+)\"")


def written_event_names() -> set[str]:
    names = set()
    for package in ("oauth", "audit", "mcpserver", "sandstorm_site"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(WRITTEN.findall(path.read_text(encoding="utf-8")))
    return names


def test_every_event_the_code_writes_has_a_sentence() -> None:
    names = written_event_names()
    assert {"token.created", "token.revoked", "credentials.rotated", "auth.failed"} <= names  # the grep works
    assert names - set(SENTENCES) == set(), "give these events a sentence in a module of audit/event_sentences/"


def test_no_event_has_sentences_in_two_modules() -> None:
    from audit.event_sentences import access, audit_log, console, oauth

    modules = (access, audit_log, console, oauth)
    assert sum(len(module.SENTENCES) for module in modules) == len(SENTENCES)


def record(event_name: str, actor: dict[str, str] | None = None, /, **detail: Any) -> AuditRecord:
    return AuditRecord(kind=KIND_EVENT, event=event_name, detail=detail or None, **(actor or {}))


ADMIN = {"username": "admin", "credential_kind": "session", "client_address": "10.0.0.5"}
SHELL = {"username": "root", "credential_kind": "shell"}
AGENT = {"username": "agent", "credential_kind": "bearer", "credential_id": "3", "credential_name": "laptop"}
TOKEN: dict[str, Any] = {"token_id": 4, "name": "laptop", "prefix": "sst_abcd", "owner": "admin", "scope": "mcp"}
CLIENT = {"client_id": "abc123", "client": "Claude (abc123)"}
SENTENCE_CASES = [
    (record("token.revoked", ADMIN, **TOKEN), "admin revoked token laptop (sst_abcd…) from 10.0.0.5"),
    (record("token.revoked", ADMIN, **{**TOKEN, "owner": "bob"}), "admin revoked token laptop (sst_abcd…) of bob from 10.0.0.5"),
    (record("token.regenerated", ADMIN, **{**TOKEN, "owner": "admin"}, previous_token_id=4, previous_prefix="sst_old1",
            stop_background=False),
     "admin regenerated token laptop (sst_abcd…) for admin from 10.0.0.5: the old secret (sst_old1…) is revoked"),
    (record("token.suspended", ADMIN, **TOKEN, stop_background=True),
     "admin suspended token laptop (sst_abcd…) from 10.0.0.5; its background processes were stopped"),
    (record("token.resumed", ADMIN, **TOKEN), "admin resumed token laptop (sst_abcd…) from 10.0.0.5"),
    (record("oauth.client_suspended", ADMIN, **CLIENT, owner="", stop_background=False),
     "admin suspended client Claude (abc123) for every user from 10.0.0.5"),
    (record("oauth.client_resumed", ADMIN, **CLIENT, owner="alice"),
     "admin resumed client Claude (abc123) for alice from 10.0.0.5"),
    (record("console.session_disconnected", ADMIN, session_id="w1-x", worker=1, credential="bearer:4",
            credential_name="laptop", owner="alice", session_address="198.51.100.4", busy=True),
     "admin disconnected the MCP session of laptop (acting as alice, opened from 198.51.100.4) in the console from "
     "10.0.0.5; its running call was cancelled"),
    (record("token.created", SHELL, **{**TOKEN, "name": "bootstrap"}),
     "OS user root, on the command line, created token bootstrap (sst_abcd…) for admin with scope mcp"),
    (record("token.first_used", {"client_address": "127.0.0.1"}, token_id=1, name="first-run", prefix="sst_ffff"),
     "token first-run (sst_ffff…) first used from 127.0.0.1"),
    (record("token.created", ADMIN, **TOKEN, confinement="host", default="workspace"),
     "admin created token laptop (sst_abcd…) for admin with scope mcp, confinement host from 10.0.0.5"),
    (record("token.confinement_changed", ADMIN, **TOKEN, previous="", confinement="host", default="workspace"),
     "admin changed the confinement of token laptop (sst_abcd…) from the installation&#x27;s default (workspace) to host "
     "from 10.0.0.5"),
    (record("oauth.confinement_changed", ADMIN, **CLIENT, owner="bob", previous="host", confinement="workspace"),
     "admin changed the confinement of client Claude (abc123) for bob from host to workspace from 10.0.0.5"),
    (record("oauth.consent", ADMIN, **CLIENT, scope="mcp", redirect_host="claude.ai", decision="approved",
            outcome="code issued", confinement="", default="host"),
     "admin approved the connection of client Claude (abc123) (scope mcp, confinement the installation&#x27;s default "
     "(host), back to claude.ai) from 10.0.0.5"),
    (record("credentials.rotated", SHELL, access_tokens=0, refresh_tokens=0, grants=0, bearer_tokens=3, clients=2,
            sessions=0, stop_background=True, kept_bearer_tokens=False, new_token_id=9, new_token_prefix="sst_new1",
            new_token_owner="admin"),
     "OS user root, on the command line, rotated all credentials: 3 bearer tokens, 2 clients; new token sst_new1… for admin"),
    (record("credentials.rotated", ADMIN, bearer_tokens=1, clients=0, kept_bearer_tokens=True, stop_background=False),
     "admin rotated all credentials from 10.0.0.5: 1 bearer token (bearer tokens kept, background processes left running)"),
    (record("admin.login", ADMIN), "admin signed in to the admin from 10.0.0.5"),
    (record("admin.login_failed", {"username": "bob", "client_address": "10.0.0.7"}), "login failed for ‘bob’ from 10.0.0.7"),
    (record("admin.login_throttled", {"username": "bob", "client_address": "10.0.0.7"}),
     "sign-in throttled for ‘bob’ from 10.0.0.7 after repeated failures"),
    (record("admin.second_factor_enrolled", ADMIN, device="authenticator app", recovery_codes=10),
     "admin set up a second factor from 10.0.0.5"),
    (record("admin.second_factor_verified", ADMIN, by="authenticator app"),
     "admin gave the second factor (authenticator app) from 10.0.0.5"),
    (record("admin.second_factor_failed", ADMIN, by="recovery code"),
     "wrong second-factor code (recovery code) for ‘admin’ from 10.0.0.5"),
    (record("admin.second_factor_failed", ADMIN, by="authenticator app", step="set-up"),
     "wrong second-factor code (authenticator app) for ‘admin’ while setting it up from 10.0.0.5"),
    (record("admin.second_factor_throttled", ADMIN, by="authenticator app"),
     "second-factor codes throttled for ‘admin’ from 10.0.0.5 after repeated wrong codes"),
    (record("admin.recovery_code_used", ADMIN, recovery_codes_left=9),
     "admin signed in with a recovery code from 10.0.0.5 (9 left)"),
    (record("admin.second_factor_reset", SHELL, user="bob", removed=["authenticator app"]),
     "OS user root, on the command line, removed the second factor of ‘bob’"),
    (record("auth.failed", {"client_address": "10.0.0.8"}, instance_id="i", reason="unknown token"),
     "authentication failed at /mcp from 10.0.0.8: unknown token"),
    (record("auth.failed", {"client_address": "10.0.0.8"}, count=41, reasons=["expired token", "unknown token"], aggregated=True),
     "authentication failed 41 times more at /mcp from 10.0.0.8: expired token, unknown token"),
    (record("audit.full", calls_refused=5, bytes=2_000_000, max_bytes=2_000_000, full=True),
     "the audit log is full (1.9 MiB of its 1.9 MiB budget): 5 tool calls refused"),
    (record("audit.pruned", SHELL, count=400, before="2025-01-01", first_id=1, last_id=400, by="root"),
     "OS user root, on the command line, pruned 400 audit records created before 2025-01-01"),
    (record("audit.loss_accepted", SHELL, loss="records_missing", problem="the audit log has lost its newest records",
            chain_restarts_after=40, records_missing=12, anchored_record_id=52),
     "OS user root, on the command line, accepted the loss of 12 audit records at start-up, the chain going on after "
     "record 40: the audit log has lost its newest records"),
    (record("audit.loss_accepted", SHELL, loss="wal_damaged", problem="the write-ahead log is damaged", chain_restarts_after=4),
     "OS user root, on the command line, accepted the loss of audit records at start-up, the chain going on after "
     "record 4: the write-ahead log is damaged"),
    (record("audit.records_held", count=3, reason="database is locked", held_seconds=41, replayed=False),
     "the database refused 3 finished call records for 41 s (database is locked); held, then written once the "
     "database took them"),
    (record("audit.records_held", count=1, reason="database or disk is full", held_seconds=600, replayed=True),
     "the database refused 1 finished call record for 600 s (database or disk is full); held, then written by the "
     "next start, from the spill file"),
    (record("oauth.client_registered", {"client_address": "203.0.113.4"}, **CLIENT, source="dcr"),
     "client Claude (abc123) registered by dynamic client registration from 203.0.113.4"),
    (record("oauth.client_registered", {}, **CLIENT, source="cimd"),
     "client Claude (abc123) registered through its client metadata document"),
    (record("oauth.consent", ADMIN, **CLIENT, scope="mcp:read", redirect_host="claude.ai", decision="approved", outcome="code issued"),
     "admin approved the connection of client Claude (abc123) (scope mcp:read, back to claude.ai) from 10.0.0.5"),
    (record("oauth.consent", ADMIN, **CLIENT, scope="mcp", decision="denied", outcome="access_denied"),
     "admin refused the connection of client Claude (abc123) (scope mcp) from 10.0.0.5: access_denied"),
    (record("oauth.consent", ADMIN, **CLIENT, scope="mcp mcp:read", redirect_host="claude.ai", decision="approved",
            outcome="code issued", upgrade_from="mcp:read", confinement="workspace", default="host"),
     "admin approved the upgrade from mcp:read of the connection of client Claude (abc123) (scope mcp mcp:read, "
     "confinement workspace, back to claude.ai) from 10.0.0.5"),
    (record("oauth.consent", ADMIN, **CLIENT, scope="mcp", decision="denied", outcome="access_denied",
            upgrade_from="mcp:read"),
     "admin refused the upgrade from mcp:read of the connection of client Claude (abc123) (scope mcp) from 10.0.0.5: "
     "access_denied"),
    (record("oauth.client_revoked", ADMIN, **CLIENT, access_tokens=2, refresh_tokens=1, grants=0),
     "admin revoked client Claude (abc123) from 10.0.0.5: 2 access tokens, 1 refresh token, 0 pending authorization codes"),
    (record("oauth.token_revoked", ADMIN, token_id=12, client="Claude (abc123)", owner="alice"),
     "admin revoked OAuth access token #12 of alice (client Claude (abc123)) from 10.0.0.5"),
    (record("oauth.code_replayed", {"client_address": "198.51.100.2"}, **CLIENT, user_id=1),
     "an authorization code of client Claude (abc123) was used a second time from 198.51.100.2: the tokens it was exchanged for were revoked"),
    (record("oauth.refresh_reused", {"client_address": "198.51.100.2"}, **CLIENT, user_id=1),
     "a revoked refresh token of client Claude (abc123) was used again from 198.51.100.2: its whole token family was revoked"),
    (record("oauth.token_refused", {"client_address": "198.51.100.2"}, **CLIENT, owner="alice",
            grant_type="refresh_token", reason="suspended", for_every_user=False),
     "the token endpoint refused to exchange a refresh token of client Claude (abc123) for alice from 198.51.100.2: the app is suspended by an administrator for alice"),
    (record("oauth.token_refused", {}, **CLIENT, owner="bob", grant_type="authorization_code", reason="suspended",
            for_every_user=True),
     "the token endpoint refused to exchange an authorization code of client Claude (abc123) for bob: the app is suspended by an administrator for every user"),
    (record("oauth.client_pruned", SHELL, **CLIENT, registered="2025-03-01T10:00:00+00:00"),
     "OS user root, on the command line, removed the unused client Claude (abc123) (registered 2025-03-01)"),
    (record("oauth.client_removed", ADMIN, **CLIENT), "admin revoked and removed client Claude (abc123) from 10.0.0.5"),
    (record("credentials.background_stopped", None, revocation_id=3, reason="bearer", revoked_by="admin", pids=[101, 102],
            credentials=["bearer:4"], commands=["sleep 1000", "npm run dev"]),
     "2 background processes stopped after a revocation (bearer) by admin: sleep 1000, npm run dev"),
    (record("credentials.processes_stopped", None, revocation_id=3, reason="bearer", revoked_by="admin", pids=[103],
            credentials=["bearer:4"], commands=["xM sleep 283"]),
     "1 process left running by the commands of a revoked credential stopped (bearer) by admin: xM sleep 283"),
    (record("background.ended", None, pid=4242, command="npm test", credential="bearer:4", state="exited",
            exit_code=0, recording={"name": "2026-12-07/ab12.jsonl.gz", "sha256": "00" * 32, "events": 12}),
     "background command 4242 (bearer:4) ended with exit code 0; its recording is kept (12 events): npm test"),
    (record("background.ended", None, pid=4243, command="sleep 99", credential="bearer:4", state="killed",
            exit_code=143, recording={"unrecorded": "recording is off (SANDSTORM_RECORDING_MAX_BYTES=0)"}),
     "background command 4243 (bearer:4) was killed (exit code 143); not recorded: recording is off "
     "(SANDSTORM_RECORDING_MAX_BYTES=0): sleep 99"),
    (record("background.ended", None, pid=4244, command="make", credential="oauth:9", state="lost", recording=None),
     "background command 4244 (oauth:9) was lost (its end was not recorded); not recorded: it printed nothing: make"),
    (record("console.call_stopped", ADMIN, call_id="c1", tool="terminal_exec", summary="sleep 600", user="alice"),
     "admin stopped a running terminal_exec call of alice from the console from 10.0.0.5: sleep 600"),
    (record("policy.changed", ADMIN, action="added", rule_id="force-push", version=4, before=None, after={}),
     "admin added policy rule force-push from 10.0.0.5 (policy version 4)"),
    (record("policy.changed", ADMIN, action="recommended_on", rule_ids=["a", "b"], version=5),
     "admin switched on the recommended policy rules a, b from 10.0.0.5 (policy version 5)"),
    (record("policy.loaded", SHELL, rule_ids=["a", "b", "c"], version=7, sha256="ab" * 32, source="policy.json"),
     "OS user root, on the command line, loaded a command policy of 3 rules from policy.json (policy version 7, "
     "sha256 abababababab…)"),
    (record("approval.decided", ADMIN, request="R-17", decision="denied", channel="console", latency_ms=4200,
            reason="<b>not now</b>", grant_minutes=None),
     "admin denied request R-17 through the console after 4.2 s: &lt;b&gt;not now&lt;/b&gt;"),
    (record("approval.decided", ADMIN, request="R-18", decision="approved", channel="console", latency_ms=900,
            reason="", grant_minutes=10),
     "admin approved request R-18 and the same command shape for 10 minutes through the console after 0.9 s"),
    (record("approval.decided", request="R-20", decision="timed_out", channel="timeout", latency_ms=300012),
     "request R-20 got no answer in 300.0 s: denied"),
    (record("approval.decided", request="R-21", decision="cancelled", channel="ended", latency_ms=1500),
     "request R-21 ended unanswered after 1.5 s (its call ended)"),
    (record("approval.grants_revoked", ADMIN, requests=["R-18"], shapes=["terminal_exec: git push --force"]),
     "admin revoked 1 timed approval grant (terminal_exec: git push --force) from 10.0.0.5"),
    (record("approval.run_in_background", AGENT, request="R-18", pid=4242, command="git push --force"),
     "approved request R-18 of agent (with bearer credential laptop) started as background command 4242: git push "
     "--force"),
    (record("approval.run_failed", AGENT, request="R-19", error="Error: cwd not found"),
     "approved request R-19 of agent (with bearer credential laptop) did not start: Error: cwd not found"),
    (record("console.background_stopped", ADMIN, pids=[101], commands=["npm run dev"], users=["alice"]),
     "admin stopped 1 background command from the console from 10.0.0.5 (started by alice): npm run dev"),
]  # fmt: skip


@pytest.mark.parametrize(("event_record", "sentence"), SENTENCE_CASES, ids=lambda value: getattr(value, "event", ""))
def test_events_read_as_sentences(event_record: AuditRecord, sentence: str) -> None:
    assert str(event_sentence(event_record)) == sentence


def test_every_sentence_builder_has_a_case() -> None:
    assert {case.event for case, _ in SENTENCE_CASES} == set(SENTENCES)


def test_agent_and_client_text_is_escaped() -> None:
    markup = "<img src=x onerror=alert(1)>"
    text = str(event_sentence(record("token.first_used", {"client_address": markup}, name=markup, prefix="sst_&")))
    assert "<img" not in text and text.count("&lt;img src=x onerror=alert(1)&gt;") == 2 and "sst_&amp;…" in text
    failed = str(event_sentence(record("admin.login_failed", {"username": "<script>alert(2)</script>"})))
    assert "<script>" not in failed and "&lt;script&gt;" in failed


def test_an_unknown_event_or_an_odd_detail_falls_back_to_its_name_and_detail() -> None:
    unknown = record("otp.device_reset", SHELL, device="phone <1>", count=2)
    assert (
        str(event_sentence(unknown))
        == "otp.device_reset by OS user root, on the command line: count=2, device=phone &lt;1&gt;"
    )
    assert str(event_sentence(record("something.new"))) == "something.new"
    odd = record("credentials.background_stopped", None, pids="not a list", commands={"a": 1})
    assert "background process" in str(event_sentence(odd))  # odd shapes are read as nothing, never a crash


@pytest.mark.django_db
def test_the_security_event_list_and_page_show_the_sentence_and_keep_the_raw_detail(admin_client: Client) -> None:
    written = event("token.revoked", Actor(username="admin", credential_kind="session", client_address="10.0.0.5"),
                    **{**TOKEN, "name": "<b>laptop</b>"})  # fmt: skip
    listing = admin_client.get("/admin/audit/securityevent/").content.decode()
    assert "admin revoked token &lt;b&gt;laptop&lt;/b&gt; (sst_abcd…) from 10.0.0.5" in listing
    assert "<b>laptop" not in listing
    page = admin_client.get(f"/admin/audit/securityevent/{written.pk}/change/").content.decode()
    assert "admin revoked token &lt;b&gt;laptop&lt;/b&gt; (sst_abcd…) from 10.0.0.5" in page
    raw = re.search(r'<pre class="audit-detail-json">(.*?)</pre>', page, re.S)
    assert raw is not None and "&quot;prefix&quot;: &quot;sst_abcd&quot;" in raw.group(1) and "<b>" not in raw.group(1)
