"""Staff told of a new approval request (mcpserver/approvals/notify.py): a webhook to a real HTTP server on
127.0.0.1, signed, retried, never redirected and never holding up its caller; e-mail through Django's backends.

The retry delays and the webhook's timeout are shortened for every test (`_quick`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import smtplib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage

from mcpserver.approvals import notify
from mcpserver.approvals.notify import ApprovalNotice, notify_staff

pytestmark = [pytest.mark.anyio]

LOGGER = "mcpserver.approvals.notify"
SECRET = "s3cret-shared-with-the-receiver"
HOOK_PATH = "/services/T000/B000/hook-token"  # a Slack webhook URL's path is itself a secret
HOSTILE = "<!channel> <http://evil|x> & more"
HANG = "hang"  # an answer: none, the connection closed when released (or the test ends)
SLOW = "slow"  # an answer: 200 once released (10 s at most)
REDIRECT = "redirect"
NOTICE = ApprovalNotice(
    label="R-17",
    tool="terminal_exec",
    summary="git push --force origin main",
    cwd="/srv/workspace",
    username="alice",
    credential_name="laptop",
    client="claude-code",
    address="203.0.113.5",
    rule_id="push-main",
    rule_reason="a push to main",
    card_url="https://sandstorm.example/console/approvals/17/",
    expires_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
)


@dataclass(frozen=True)
class Received:
    path: str
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver(ThreadingHTTPServer):
    """A webhook endpoint: answers each POST with the next of `answers` (then 200), and keeps what it received."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        self.answers: list[int | str] = []
        self.received: list[Received] = []
        self.release = threading.Event()  # ends the answers that hang

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{HOOK_PATH}"

    def wait_for(self, count: int, within: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + within
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.received


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.received.append(Received(self.path, self.headers, body))
        answer = self.server.answers.pop(0) if self.server.answers else 200
        if answer in (HANG, SLOW):
            self.server.release.wait(10)
            answer = 200 if answer == SLOW else answer
        if answer == HANG:
            return
        if answer == REDIRECT:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere")
        else:
            assert isinstance(answer, int)
            self.send_response(answer)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read what was received."""


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setattr(notify, "WEBHOOK_RETRY_DELAYS", (0.01, 0.01, 0.01))
    monkeypatch.setattr(notify, "WEBHOOK_TIMEOUT", 2.0)
    monkeypatch.setattr(notify, "EMAIL_RETRY_DELAY", 0.01)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # the receiver is on 127.0.0.1, whatever proxy the host has
    settings.APPROVAL_WEBHOOK_URL = ""
    settings.APPROVAL_WEBHOOK_SECRET = ""
    settings.APPROVAL_EMAIL = ()
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    settings.APPROVAL_WEBHOOK_URL = server.url
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def signature_is_valid(received: Received, secret: str) -> bool:
    """What a receiver does (the module's docstring): HMAC of "<timestamp>.<raw body>", compared in constant time."""
    timestamp = received.headers["X-Sandstorm-Timestamp"]
    signature = received.headers["X-Sandstorm-Signature"]
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + received.body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(timestamp)) < 300
    return fresh and signature.startswith("v1=") and hmac.compare_digest(signature.removeprefix("v1="), expected)


def mrkdwn_texts(payload: dict[str, Any]) -> list[str]:
    """Every text Slack reads as mrkdwn: the top-level text and each mrkdwn text object of the blocks."""
    objects = [block["text"] for block in payload["blocks"] if "text" in block]
    objects += [field for block in payload["blocks"] for field in block.get("fields", [])]
    return [payload["text"]] + [text["text"] for text in objects if text["type"] == "mrkdwn"]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# --- the webhook ------------------------------------------------------------------------------------------------


async def test_the_webhook_carries_slack_text_blocks_and_every_field(receiver: Receiver) -> None:
    notify_staff(NOTICE)
    await notify.drain()

    [received] = receiver.received
    assert received.path == HOOK_PATH
    assert received.headers["Content-Type"] == "application/json"
    assert received.headers["User-Agent"].startswith("Sandstorm/")
    assert "X-Sandstorm-Signature" not in received.headers  # no secret set: unsigned
    payload = received.json()
    for part in ("R-17", "alice", "terminal_exec", "git push --force origin main", NOTICE.card_url):
        assert part in payload["text"]
    assert "\n" not in payload["text"]
    [button] = [block["accessory"] for block in payload["blocks"] if "accessory" in block]
    assert button["type"] == "button" and button["url"] == NOTICE.card_url
    assert payload["sandstorm"] == {
        "label": "R-17",
        "tool": "terminal_exec",
        "summary": "git push --force origin main",
        "cwd": "/srv/workspace",
        "user": "alice",
        "credential": "laptop",
        "client": "claude-code",
        "address": "203.0.113.5",
        "rule": "push-main",
        "reason": "a push to main",
        "card_url": NOTICE.card_url,
        "expires_at": "2030-01-02T03:04:05+00:00",
    }


async def test_a_signed_webhook_verifies_with_the_shared_secret_only(receiver: Receiver, settings: Any) -> None:
    settings.APPROVAL_WEBHOOK_SECRET = SECRET
    notify_staff(NOTICE)
    await notify.drain()

    [received] = receiver.received
    assert signature_is_valid(received, SECRET)
    assert not signature_is_valid(received, "another-secret")
    tampered = replace(received, body=received.body.replace(b"alice", b"mallory"))
    assert not signature_is_valid(tampered, SECRET)


async def test_a_hostile_command_is_escaped_for_slack_and_exact_in_the_structured_part(receiver: Receiver) -> None:
    hostile = replace(
        NOTICE,
        summary=HOSTILE,
        username=f"alice {HOSTILE}",
        tool=f"terminal_exec{HOSTILE}",
        cwd=HOSTILE,
        client=HOSTILE,
        rule_reason=HOSTILE,
    )
    notify_staff(hostile)
    await notify.drain()

    payload = receiver.received[0].json()
    texts = mrkdwn_texts(payload)
    assert any("&lt;!channel&gt; &lt;http://evil|x&gt; &amp; more" in text for text in texts[1:])
    assert "&lt;!channel&gt; &lt;http://evil|x&gt; &amp; more" in payload["text"]
    for text in texts:
        assert "<" not in text and ">" not in text  # Slack's links, mentions and dates all start with "<"
        assert text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "").count("&") == 0
    assert payload["sandstorm"]["summary"] == HOSTILE
    assert payload["sandstorm"]["user"] == f"alice {HOSTILE}"


async def test_a_long_command_is_shortened_in_the_text_and_whole_in_the_structured_part(receiver: Receiver) -> None:
    command = "echo " + "&" * 10_000
    notify_staff(replace(NOTICE, summary=command))
    await notify.drain()

    payload = receiver.received[0].json()
    assert payload["text"].count("&amp;") < 310
    assert all(len(text) <= 3000 for text in mrkdwn_texts(payload))  # Slack refuses a longer section
    assert payload["sandstorm"]["summary"] == command


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_server_error_is_retried_and_delivered_on_the_second_attempt(
    receiver: Receiver, settings: Any, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings.APPROVAL_WEBHOOK_SECRET = SECRET
    receiver.answers = [status, 200]
    notify_staff(NOTICE)
    await notify.drain()

    assert len(receiver.received) == 2
    assert all(signature_is_valid(received, SECRET) for received in receiver.received)
    assert "R-17: webhook to http://127.0.0.1" in caplog.text and "delivered (attempt 2)" in caplog.text
    assert warnings_of(caplog) == []


async def test_a_client_error_is_not_retried_and_is_logged(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.answers = [400]
    notify_staff(NOTICE)
    await notify.drain()

    assert len(receiver.received) == 1
    [warning] = warnings_of(caplog)
    assert "failed after 1 attempt(s): HTTP 400" in warning


async def test_a_redirect_is_not_followed(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.answers = [REDIRECT]
    notify_staff(NOTICE)
    await notify.drain()

    assert [received.path for received in receiver.received] == [HOOK_PATH]
    [warning] = warnings_of(caplog)
    assert "HTTP 302, a redirect" in warning


async def test_a_receiver_that_never_answers_is_tried_four_times_then_logged_without_secrets(
    receiver: Receiver,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(notify, "WEBHOOK_TIMEOUT", 0.2)
    settings.APPROVAL_WEBHOOK_SECRET = SECRET
    receiver.answers = [HANG] * 4
    notify_staff(NOTICE)
    await notify.drain()

    assert len(receiver.wait_for(4)) == 4
    [warning] = warnings_of(caplog)
    assert "failed after 4 attempt(s)" in warning and "timed out" in warning
    assert SECRET not in caplog.text and "hook-token" not in caplog.text


async def test_a_refused_connection_is_retried_then_logged(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings.APPROVAL_WEBHOOK_URL = f"http://127.0.0.1:{port}/hook"
    notify_staff(NOTICE)
    await notify.drain()

    [warning] = warnings_of(caplog)
    assert "failed after 4 attempt(s)" in warning and "refused" in warning


async def test_notify_staff_returns_at_once_while_the_receiver_takes_its_time(
    receiver: Receiver, settings: Any
) -> None:
    settings.APPROVAL_EMAIL = ("staff@example.com",)
    receiver.answers = [SLOW]  # answers when released: long after notify_staff returned
    started = time.perf_counter()
    notify_staff(NOTICE)
    elapsed = time.perf_counter() - started

    # The receiver answers only once released, after this: a notify_staff that waited for it would not return at all
    # (and "still delivering" below says the same without a clock).
    assert elapsed < 5
    assert await notify.drain(timeout=0.2) is False  # still delivering
    receiver.release.set()
    assert await notify.drain(timeout=5) is True
    assert len(receiver.received) == 1 and len(mail.outbox) == 1


async def test_nothing_configured_sends_nothing_and_schedules_nothing() -> None:
    tasks, threads = asyncio.all_tasks(), threading.active_count()
    notify_staff(NOTICE)

    assert asyncio.all_tasks() == tasks and threading.active_count() == threads
    assert await notify.drain(timeout=0) is True
    assert mail.outbox == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/hook", "http://user:pw@example.com/", "x"])
async def test_a_webhook_url_that_is_not_http_is_not_used(
    url: str, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.APPROVAL_WEBHOOK_URL = url
    tasks = asyncio.all_tasks()
    notify_staff(NOTICE)

    assert asyncio.all_tasks() == tasks
    [warning] = warnings_of(caplog)
    assert "not an http(s) URL" in warning and "pw" not in warning


def test_without_an_event_loop_a_thread_delivers(receiver: Receiver) -> None:
    notify_staff(NOTICE)

    assert len(receiver.wait_for(1)) == 1
    assert asyncio.run(notify.drain(timeout=5)) is True


# --- e-mail -----------------------------------------------------------------------------------------------------


async def test_an_email_goes_to_the_recipients_with_the_fields_and_the_link(settings: Any) -> None:
    settings.APPROVAL_EMAIL = ("ops@example.com", "oncall@example.com")
    settings.DEFAULT_FROM_EMAIL = "sandstorm@example.com"
    notify_staff(NOTICE)
    await notify.drain()

    [message] = mail.outbox
    assert isinstance(message, EmailMessage)
    assert message.to == ["ops@example.com", "oncall@example.com"] and message.bcc == []
    assert message.from_email == "sandstorm@example.com"
    assert message.subject == "Sandstorm: approval requested (R-17): terminal_exec by alice"
    assert message.content_subtype == "plain" and not getattr(message, "alternatives", [])
    for part in ("git push --force origin main", "/srv/workspace", "laptop", "203.0.113.5", "a push to main"):
        assert part in message.body
    assert f"\n{NOTICE.card_url}\n" in message.body


async def test_an_email_subject_stays_one_line_whatever_the_names_hold(settings: Any) -> None:
    settings.APPROVAL_EMAIL = ("ops@example.com",)
    notice = replace(NOTICE, username="alice\nBcc: evil@example.com", tool="terminal\r\nexec")
    notify_staff(notice)
    await notify.drain()

    [message] = mail.outbox
    assert "\n" not in message.subject and "\r" not in message.subject and len(message.subject) <= 150
    assert message.subject == "Sandstorm: approval requested (R-17): terminal exec by alice Bcc: evil@example.com"
    assert message.recipients() == ["ops@example.com"] and message.message()["Bcc"] is None
    assert "User:       alice Bcc: evil@example.com\n" in message.body


class RefusingBackend(BaseEmailBackend):
    """An SMTP server that drops every connection."""

    attempts = 0

    def send_messages(self, email_messages: Any) -> int:
        RefusingBackend.attempts += 1
        raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")


async def test_an_smtp_failure_is_retried_once_then_logged_not_raised(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.APPROVAL_EMAIL = ("ops@example.com",)
    settings.EMAIL_BACKEND = f"{__name__}.RefusingBackend"
    RefusingBackend.attempts = 0
    notify_staff(NOTICE)
    await notify.drain()

    assert RefusingBackend.attempts == 2
    [warning] = warnings_of(caplog)
    assert "R-17: e-mail to ops@example.com failed after 2 attempts: SMTPServerDisconnected" in warning


async def test_an_smtp_server_that_is_not_there_is_logged_not_raised(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings.APPROVAL_EMAIL = ("ops@example.com",)
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    notify_staff(NOTICE)
    await notify.drain()

    [warning] = warnings_of(caplog)
    assert "failed after 2 attempts: ConnectionRefusedError" in warning
