"""Secrets shown once across a redirect: a POST that makes a secret keeps it in the session and redirects; the GET
page takes it out as it shows it, so a reload (or the Back button) finds it gone and says so instead of making a
second secret."""

from __future__ import annotations

import secrets
import time
from typing import Any

from django.http import HttpRequest

SESSION_KEY = "sandstorm_shown_once"
# A secret nobody came to see is dropped after this long: the session row should not keep it.
KEEP_SECONDS = 600


def keep(request: HttpRequest, what: str, payload: dict[str, Any]) -> str:
    """Keep `payload` (JSON-serialisable) for one showing; returns the ticket the GET page is addressed by."""
    ticket = secrets.token_urlsafe(12)
    now = time.time()
    kept = {key: entry for key, entry in request.session.get(SESSION_KEY, {}).items() if entry["until"] > now}
    kept[ticket] = {"what": what, "until": now + KEEP_SECONDS, "payload": payload}
    request.session[SESSION_KEY] = kept
    return ticket


def take(request: HttpRequest, what: str, ticket: str) -> dict[str, Any] | None:
    """The payload kept under `ticket` for `what`, removed from the session; None if it was shown already (or never
    kept, or kept too long ago)."""
    kept = dict(request.session.get(SESSION_KEY, {}))
    entry = kept.pop(ticket, None)
    if entry is None or entry["what"] != what:
        return None
    request.session[SESSION_KEY] = kept
    if entry["until"] <= time.time():
        return None
    payload: dict[str, Any] = entry["payload"]
    return payload
