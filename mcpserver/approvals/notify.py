"""Telling staff that a tool call waits for their approval, for when nobody is looking at the console: a webhook
(Slack-compatible JSON, signed when APPROVAL_WEBHOOK_SECRET is set) and e-mail to APPROVAL_EMAIL.

`notify_staff` never holds up the call that asked: it schedules the deliveries and returns. They run as a task on
the running event loop (a daemon thread of their own when there is none), their blocking I/O on worker threads; a
delivery that fails in the end is logged, never raised. `drain` waits for them (tests, a graceful stop).

What an agent chose (the command, the working directory, even the user and client names) reaches Slack escaped
(`&`, `<`, `>`), so it can make no link or mention (`<!channel>`) of its own, and with its control and bidirectional
characters spelled out (audit.visible); the `sandstorm` part of the JSON carries every field exactly.

Verifying a signed webhook, on the receiving side: take the raw body exactly as received and the
X-Sandstorm-Timestamp header (unix seconds); compute the hex HMAC-SHA256, keyed with the shared secret, of
`<timestamp>.<body>`; compare it in constant time with X-Sandstorm-Signature after its `v1=`; and refuse a timestamp
more than five minutes from your clock (a replayed request). Each attempt is signed afresh, with its own timestamp:

    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    valid = hmac.compare_digest(signature.removeprefix("v1="), expected) and abs(time.time() - int(timestamp)) < 300
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import json
import logging
import smtplib
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import IO
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from audit.visible import hidden_count, make_visible, one_line
from mcpserver.process import sandstorm_version

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT = 10.0  # seconds, per attempt
WEBHOOK_RETRY_DELAYS: tuple[float, ...] = (1.0, 5.0, 25.0)  # before the 2nd, 3rd and 4th attempts
EMAIL_TIMEOUT = 30.0  # seconds, unless EMAIL_TIMEOUT is set: Django's SMTP backend would otherwise wait forever
EMAIL_RETRY_DELAY = 10.0  # seconds before the one retry of an e-mail
TEXT_COMMAND_LIMIT = 300  # characters of the command in the one-line summary
BLOCK_COMMAND_LIMIT = 2500  # Slack refuses a section text over 3000 characters, and with it the whole message
FIELD_LIMIT = 300
SUBJECT_LIMIT = 150
EMAIL_COMMAND_LIMIT = 20_000

_SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})

_tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones
_threads: set[threading.Thread] = set()


@dataclass(frozen=True)
class ApprovalNotice:
    """What staff are told about a new approval request."""

    label: str  # "R-17"
    tool: str
    summary: str  # the exact command, or a one-line rendering of the arguments
    cwd: str  # "" if none
    username: str
    credential_name: str
    client: str  # client id or name, "" if none
    address: str  # the client's IP address
    rule_id: str
    rule_reason: str
    card_url: str  # the request's page in the console, absolute
    expires_at: datetime


@dataclass(frozen=True)
class _Targets:
    """Where to deliver, read from the settings when the request is made."""

    webhook_url: str
    webhook_secret: str
    email: tuple[str, ...]


@dataclass(frozen=True)
class _Attempt:
    delivered: bool
    retry: bool  # whether another attempt may succeed
    detail: str  # for the log: never the URL or the secret


# --- scheduling -------------------------------------------------------------------------------------------------


def notify_staff(notice: ApprovalNotice) -> None:
    """Schedule the webhook and e-mail about a new approval request, and return at once; never raises."""
    targets = _configured_targets()
    if not (targets.webhook_url or targets.email):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # called from synchronous code: a thread with a loop of its own
        _start_thread(notice, targets)
    else:
        _schedule(notice, targets)


async def drain(timeout: float | None = None) -> bool:
    """Wait for the deliveries scheduled so far (on this loop, or on threads), at most `timeout` seconds; whether
    they all ended. A webhook that keeps failing takes up to about 70 s with the default retries."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        tasks = [task for task in _tasks.copy() if task.get_loop() is loop]
        threads = _threads.copy()
        left = None if deadline is None else deadline - loop.time()
        if not (tasks or threads) or (left is not None and left <= 0):
            return not (tasks or threads)
        if tasks:
            await asyncio.wait(tasks, timeout=left)
        for thread in threads:
            await asyncio.to_thread(thread.join, left)
            if not thread.is_alive():
                _threads.discard(thread)


def _configured_targets() -> _Targets:
    url = settings.APPROVAL_WEBHOOK_URL
    if url and not _is_http_url(url):
        logger.warning("approval webhook not sent: SANDSTORM_APPROVAL_WEBHOOK_URL is not an http(s) URL")
        url = ""
    return _Targets(url, settings.APPROVAL_WEBHOOK_SECRET, tuple(settings.APPROVAL_EMAIL))


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    plain = url.isprintable() and " " not in url
    return plain and parts.scheme in ("http", "https") and bool(parts.hostname) and parts.username is None


def _schedule(notice: ApprovalNotice, targets: _Targets) -> asyncio.Task[None]:
    task = asyncio.get_running_loop().create_task(_deliver(notice, targets), name=f"notify {notice.label}")
    _tasks.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task[None]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        # Each delivery handles the failures it expects; anything else is a bug, which must not pass unseen.
        logger.error("approval notice: %s failed", task.get_name(), exc_info=error)


def _start_thread(notice: ApprovalNotice, targets: _Targets) -> None:
    thread = threading.Thread(target=_run_in_thread, args=(notice, targets), name=f"notify {notice.label}", daemon=True)
    _threads.add(thread)
    try:
        thread.start()
    except RuntimeError:  # the interpreter is out of threads or shutting down
        _threads.discard(thread)
        logger.exception("approval %s: staff not notified, no thread to do it", notice.label)


def _run_in_thread(notice: ApprovalNotice, targets: _Targets) -> None:
    try:
        asyncio.run(_deliver_watched(notice, targets))
    finally:
        _threads.discard(threading.current_thread())


async def _deliver_watched(notice: ApprovalNotice, targets: _Targets) -> None:
    await asyncio.wait([_schedule(notice, targets)])


async def _deliver(notice: ApprovalNotice, targets: _Targets) -> None:
    deliveries = []
    if targets.webhook_url:
        deliveries.append(_post_webhook(notice, targets.webhook_url, targets.webhook_secret))
    if targets.email:
        deliveries.append(_send_email(notice, targets.email))
    await asyncio.gather(*deliveries)


# --- the webhook ------------------------------------------------------------------------------------------------


async def _post_webhook(notice: ApprovalNotice, url: str, secret: str) -> None:
    body = json.dumps(_payload(notice)).encode()
    parts = urlsplit(url)
    where = f"{parts.scheme}://{parts.netloc}"  # the path of a Slack webhook URL is its secret
    for attempts, delay in enumerate((0.0, *WEBHOOK_RETRY_DELAYS), start=1):
        await asyncio.sleep(delay)
        attempt = await asyncio.to_thread(_post_once, url, body, secret)
        if attempt.delivered:
            logger.info("approval %s: webhook to %s delivered (attempt %d)", notice.label, where, attempts)
            return
        if not attempt.retry:
            break
    logger.warning(
        "approval %s: webhook to %s failed after %d attempt(s): %s", notice.label, where, attempts, attempt.detail
    )


def _post_once(url: str, body: bytes, secret: str) -> _Attempt:
    request = urllib.request.Request(url, data=body, headers=_webhook_headers(body, secret), method="POST")
    opener = urllib.request.build_opener(_RefuseRedirects)  # per attempt: proxy settings of the environment now
    try:
        with opener.open(request, timeout=WEBHOOK_TIMEOUT) as response:
            return _Attempt(True, False, f"HTTP {response.status}")
    except urllib.error.HTTPError as error:
        error.close()
        if 300 <= error.code < 400:
            return _Attempt(False, False, f"HTTP {error.code}, a redirect, which is not followed")
        return _Attempt(False, error.code == 429 or error.code >= 500, f"HTTP {error.code}")
    except (OSError, http.client.HTTPException) as error:  # refused, DNS (URLError), timeout, answer cut short
        return _Attempt(False, True, f"{type(error).__name__}: {error}")


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect ends the attempt (urllib raises it as an HTTPError): the notice goes to the configured URL only."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> None:
        return None


def _webhook_headers(body: bytes, secret: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": f"Sandstorm/{sandstorm_version()}"}
    if secret:
        timestamp = str(int(time.time()))
        signature = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        headers["X-Sandstorm-Timestamp"] = timestamp
        headers["X-Sandstorm-Signature"] = f"v1={signature}"
    return headers


def _payload(notice: ApprovalNotice) -> dict[str, object]:
    """Slack's `text` (the one line notifications show) and `blocks`, and every field exactly under `sandstorm`."""
    return {"text": _mrkdwn(_one_line_summary(notice), 3000), "blocks": _blocks(notice), "sandstorm": _fields(notice)}


def _one_line_summary(notice: ApprovalNotice) -> str:
    command = _one_line(notice.summary, TEXT_COMMAND_LIMIT)
    who = _one_line(f"{notice.username} wants to run {notice.tool}", 2 * FIELD_LIMIT)
    return f"Sandstorm: approval requested ({_one_line(notice.label, 40)}): {who}: {command} {notice.card_url}"


def _blocks(notice: ApprovalNotice) -> list[dict[str, object]]:
    who = f"*{_mrkdwn(notice.username, FIELD_LIMIT)}* wants to run `{_mrkdwn(notice.tool, FIELD_LIMIT)}`"
    button = {
        "type": "button",
        "text": {"type": "plain_text", "text": "Review in the console"},
        "url": notice.card_url,
        "action_id": "sandstorm-review",
    }
    details = [
        ("Credential", notice.credential_name),
        ("Client", notice.client),
        ("Address", notice.address),
        ("Working directory", notice.cwd),
        ("Rule", notice.rule_id),
        ("Reason", notice.rule_reason),
        ("Expires", notice.expires_at.isoformat(timespec="seconds")),
    ]
    blocks: list[dict[str, object]] = [
        {
            "type": "section",
            "text": _text(f"*Approval requested ({_mrkdwn(notice.label, 40)})*: {who}"),
            "accessory": button,
        },
        {"type": "section", "text": _text(f"```{_mrkdwn(notice.summary, BLOCK_COMMAND_LIMIT) or ' '}```")},
    ]
    if note := _hidden_note(notice.summary):
        blocks.append({"type": "section", "text": _text(f"*{note}*")})
    blocks.append(
        {
            "type": "section",
            "fields": [_text(f"*{name}*\n{_mrkdwn(value, FIELD_LIMIT) or '-'}") for name, value in details],
        }
    )
    return blocks


def _text(mrkdwn: str) -> dict[str, object]:
    # verbatim: Slack links no URL, channel name or mention of its own accord, on top of the escaping.
    return {"type": "mrkdwn", "text": mrkdwn, "verbatim": True}


def _fields(notice: ApprovalNotice) -> dict[str, str]:
    return {
        "label": notice.label,
        "tool": notice.tool,
        "summary": notice.summary,
        "cwd": notice.cwd,
        "user": notice.username,
        "credential": notice.credential_name,
        "client": notice.client,
        "address": notice.address,
        "rule": notice.rule_id,
        "reason": notice.rule_reason,
        "card_url": notice.card_url,
        "expires_at": notice.expires_at.isoformat(),
    }


def _mrkdwn(text: str, limit: int) -> str:
    """`text` for Slack's mrkdwn, at most `limit` characters: `&`, `<` and `>` escaped as Slack requires, control and
    bidirectional characters spelled out; shortened with "…", never inside an escape."""
    escaped = make_visible(text).translate(_SLACK_ESCAPES)
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    entity = cut.rfind("&")  # every `&` left starts an escape
    if entity != -1 and ";" not in cut[entity:]:
        cut = cut[:entity]
    spelled = cut.rfind("⟪")
    if spelled != -1 and "⟫" not in cut[spelled:]:
        cut = cut[:spelled]
    return cut + "…"


def _one_line(text: str, limit: int) -> str:
    """`text` on one line (any run of whitespace one space), hidden characters spelled out, at most `limit` long."""
    return one_line(text, limit)


def _hidden_note(command: str) -> str:
    """The line that says a command hides characters (spelled out where it is shown), or ""."""
    count = hidden_count(command, in_html=False)  # as make_visible spells them in these texts
    if not count:
        return ""
    return f"This command contains {count} hidden character{'s' if count != 1 else ''}, shown as ⟪U+…⟫."


# --- e-mail -----------------------------------------------------------------------------------------------------


async def _send_email(notice: ApprovalNotice, recipients: tuple[str, ...]) -> None:
    message = EmailMessage(_email_subject(notice), _email_body(notice), to=list(recipients))
    failure: Exception | None = None
    for delay in (0.0, EMAIL_RETRY_DELAY):
        await asyncio.sleep(delay)
        try:
            await asyncio.to_thread(_send, message)
        except (smtplib.SMTPException, OSError) as error:
            failure = error
            continue
        logger.info("approval %s: e-mail sent to %s", notice.label, ", ".join(recipients))
        return
    logger.warning(
        "approval %s: e-mail to %s failed after 2 attempts: %s: %s",
        notice.label,
        ", ".join(recipients),
        type(failure).__name__,
        failure,
    )


def _send(message: EmailMessage) -> None:
    message.connection = get_connection(timeout=settings.EMAIL_TIMEOUT or EMAIL_TIMEOUT)
    message.send()


def _email_subject(notice: ApprovalNotice) -> str:
    # One line, whatever the names hold: Django refuses a subject with a line break (header injection).
    return _one_line(
        f"Sandstorm: approval requested ({notice.label}): {notice.tool} by {notice.username}", SUBJECT_LIMIT
    )


def _email_body(notice: ApprovalNotice) -> str:
    command = make_visible(notice.summary)
    hidden = f"{note}\n\n" if (note := _hidden_note(notice.summary)) else ""
    if len(command) > EMAIL_COMMAND_LIMIT:
        command = command[:EMAIL_COMMAND_LIMIT] + "\n… (shortened: the console shows it whole)"
    rows = [
        ("Request", notice.label),
        ("Tool", notice.tool),
        ("User", notice.username),
        ("Credential", notice.credential_name),
        ("Client", notice.client or "-"),
        ("Address", notice.address or "-"),
        ("Directory", notice.cwd or "-"),
        ("Rule", notice.rule_id),
        ("Reason", notice.rule_reason or "-"),
        ("Expires", notice.expires_at.isoformat(timespec="seconds")),
    ]
    # Each field on one line, and the command indented: no text of an agent's can pose as a line of this message.
    fields = "\n".join(f"{name + ':':<12}{_one_line(value, 1000)}" for name, value in rows)
    return (
        "A tool call waits for a staff user's approval.\n\n"
        f"{fields}\n\nCommand:\n{textwrap.indent(command, '    ', lambda line: True)}\n\n{hidden}"
        f"Approve or deny it in the console:\n{notice.card_url}\n\n"
        "If nobody answers before it expires, the call is denied.\n"
    )
