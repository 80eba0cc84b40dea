"""Redaction, excerpts and failure aggregation of the audit log."""

from __future__ import annotations

import hashlib

import pytest

from audit.excerpt import excerpt, store_arguments
from audit.failures import MAX_TRACKED_ADDRESSES, OVERFLOW, FailureAggregator
from audit.redaction import MASK, redact, redact_text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("git clone https://alice:s3cret-pass@github.com/o/r.git", "s3cret-pass"),
        ("git clone https://ghp_abcdefghijklmnopqrstu@github.com/o/r", "ghp_abcdefghijklmnopqrstu"),
        ("curl -H 'Authorization: Bearer tok_abcdefgh1234' x", "tok_abcdefgh1234"),
        ('curl -H "authorization: basic dXNlcjpwYXNz" x', "dXNlcjpwYXNz"),
        ("wget --header='Authorization: token abcdef123456' x", "abcdef123456"),
        ("echo bearer abcdefgh12345678", "abcdefgh12345678"),
        ("export GITHUB_TOKEN=abc123secretvalue && make", "abc123secretvalue"),
        ("DB_PASSWORD='correct horse' ./run", "correct horse"),
        ('{"api_key": "k-123456"}', "k-123456"),
        ("mysql --password=hunter2 -u root", "hunter2"),
        ("tool --token abcdef0123 --verbose", "abcdef0123"),
        ("echo sst_abcdefghijklmnopqrstuvwxyz0123", "abcdefghijklmnopqrstuvwxyz0123"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG aws s3 ls", "wJalrXUtnFEMI/K7MDENG"),
    ],
)
def test_secrets_in_commands_are_redacted(text: str, secret: str) -> None:
    redacted = redact_text(text)
    assert secret not in redacted
    assert MASK in redacted


def test_ordinary_commands_are_left_alone() -> None:
    for text in (
        "ls -la /tmp",
        "git push origin main",
        "python3 -m pytest -k token_tests",
        "grep -r password_reset src/",
    ):
        assert redact_text(text) == text


def test_values_under_secret_named_keys_are_masked_in_nested_arguments() -> None:
    assert redact({"env": {"NPM_TOKEN": "abc", "HOME": "/root"}, "list": ["Bearer abcdefgh12345"]}) == {
        "env": {"NPM_TOKEN": MASK, "HOME": "/root"},
        "list": [f"Bearer {MASK}"],
    }


def test_a_long_text_keeps_head_and_tail_with_its_full_size_and_hash() -> None:
    text = "HEAD" + "é" * 50_000 + "TAIL"
    cut = excerpt(text, 1000)
    data = text.encode()
    assert cut.cut and cut.size == len(data) and cut.sha256 == hashlib.sha256(data).hexdigest()
    assert cut.text.startswith("HEAD") and cut.text.endswith("TAIL")
    assert len(cut.text.encode()) < 2 * 1000 + 200


def test_a_short_text_is_kept_whole_but_redacted() -> None:
    cut = excerpt("token=abcdef123456", 1000)
    assert not cut.cut and "abcdef123456" not in cut.text
    assert cut.sha256 == hashlib.sha256(b"token=abcdef123456").hexdigest()


def test_stored_arguments_note_each_large_value() -> None:
    stored = store_arguments({"path": "a.txt", "content": "x" * 100_000}, 1000)
    assert stored.arguments["path"] == "a.txt"
    assert len(stored.arguments["content"]) < 2200
    assert stored.large == {"content": {"size": 100_000, "sha256": hashlib.sha256(b"x" * 100_000).hexdigest()}}


def test_failures_are_recorded_once_per_address_then_counted() -> None:
    failures = FailureAggregator()
    assert failures.note("10.0.0.1", "invalid_token") is True
    assert failures.note("10.0.0.1", "missing_token") is False
    assert failures.note("10.0.0.1", "invalid_token") is False
    assert failures.note("10.0.0.2", "invalid_token") is True
    assert failures.drain() == [("10.0.0.1", 2, ["invalid_token", "missing_token"])]
    assert failures.drain() == []
    assert failures.note("10.0.0.1", "invalid_token") is True  # a new window


def test_a_flood_from_many_addresses_is_bounded() -> None:
    failures = FailureAggregator()
    immediate = sum(
        failures.note(f"10.1.{n // 256}.{n % 256}", "invalid_token") for n in range(MAX_TRACKED_ADDRESSES + 500)
    )
    assert immediate == MAX_TRACKED_ADDRESSES
    assert (OVERFLOW, 500, ["invalid_token"]) in failures.drain()
