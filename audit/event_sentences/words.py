"""The words every event's sentence is made of: values cut to length, counts, lists, who acted and from where.

Every piece goes through format_html, so all of it is escaped and nothing is ever marked safe that was not built here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from audit.models import AuditRecord

VALUE_CHARS = 80


LISTED = 3  # commands, reasons, ... named before "and N more"


Detail = dict[str, Any]


Sentence = Callable[[AuditRecord, Detail], SafeString]


def text(detail: Detail, key: str) -> str:
    value = detail.get(key)
    if value is None:
        return ""
    return Truncator(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).chars(VALUE_CHARS)


def count(detail: Detail, key: str) -> int:
    value = detail.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def counted(number: int, singular: str, plural: str | None = None) -> str:
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def listing(items: list[str]) -> str:
    shown = [Truncator(item).chars(VALUE_CHARS) for item in items[:LISTED]]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def strings(detail: Detail, key: str) -> list[str]:
    value = detail.get(key)
    return [str(item) for item in value] if isinstance(value, list) else []


def who(record: AuditRecord, *, subject: bool = True) -> SafeString:
    """Who acted: an admin by name, the OS user of a command line as such, or "someone" if the record does not say.
    As the `subject` of a sentence, the command line's note is set off by commas on both sides."""
    name = record.username
    if record.credential_kind == "shell":
        return format_html("OS user {}, on the command line{}", name or "(unknown)", "," if subject else "")
    if record.credential_kind in ("", "session"):
        return format_html("{}", name or "someone")
    credential = record.credential_name or record.credential_id
    return format_html("{} (with {} credential {})", name or "someone", record.credential_kind, credential)


def from_address(record: AuditRecord) -> SafeString:
    if not record.client_address or record.credential_kind == "shell":
        return SafeString("")
    return format_html(" from {}", record.client_address)


def token_label(detail: Detail) -> SafeString:
    name, prefix = text(detail, "name"), text(detail, "prefix")
    if not name and not prefix:
        return format_html("token #{}", text(detail, "token_id") or "?")
    if not prefix:
        return format_html("token {}", name)
    return format_html("token {} ({}…)", name or f"#{text(detail, 'token_id')}", prefix)


def client_label(detail: Detail) -> SafeString:
    return format_html("client {}", text(detail, "client") or text(detail, "client_id") or "(unknown)")


def confinement_label(detail: Detail, key: str) -> str:
    """A confinement profile of an event's detail: "host", or "the installation's default (workspace)" for ""."""
    choice = text(detail, key)
    if choice:
        return choice
    default = text(detail, "default")
    return f"the installation's default ({default})" if default else "the installation's default"


def background_words(detail: Detail) -> str:
    """A suspension's or regeneration's note on the credential's background processes, when they were stopped too."""
    return "; its background processes were stopped" if detail.get("stop_background") else ""
