"""The canonical form a record's mac is computed over, and the keyed hash of it.

The canonical form of a record is json.dumps({**content, "prev_mac": ...}, sort_keys=True, separators=(",", ":"),
ensure_ascii=False) of the fields in CHAINED_FIELDS, a datetime written as UTC ISO 8601 with microseconds. It is
defined once, here, by `Encoder`: a record is encoded from its attributes when it is appended, and again from the
row the database gives back when the chain is verified, through the same code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from json.encoder import encode_basestring
from operator import itemgetter
from typing import Any

from django.db.models import CharField, TextField
from django.utils.dateparse import parse_datetime

from audit.models import AuditRecord

# Every field the mac covers, in a fixed order. `id` is left out: the chain itself fixes the order.
CHAINED_FIELDS = (
    "kind", "created_at", "instance_id", "call_id", "started_id",
    "user_id", "username", "credential_kind", "credential_id", "credential_name", "scope",
    "client_address", "user_agent", "session_id", "protocol_version",
    "tool", "arguments", "arguments_size", "arguments_sha256",
    "outcome", "reason", "exit_code", "duration_ms", "result_excerpt", "result_size", "result_sha256",
    "event", "detail",
)  # fmt: skip
JSON_FIELDS = frozenset({"arguments", "detail"})
KEYS = (*CHAINED_FIELDS, "prev_mac")  # the encoded values, in the order an Encoder reads them

_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_loads = json.loads


def _is_text(name: str) -> bool:
    return name == "prev_mac" or isinstance(AuditRecord._meta.get_field(name), CharField | TextField)


def _encode(value: Any) -> str:
    """One value exactly as the canonical json.dumps writes it."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is str:
        return encode_basestring(value)
    if kind is int:
        return int.__repr__(value)
    if isinstance(value, datetime):
        return _timestamp(value)
    return _dumps(value)


def _timestamp(value: Any) -> str:
    """A created_at: a datetime (naive means UTC, as Django stores it) or the text a database keeps it as."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError("unreadable created_at")
        value = parsed
    if not isinstance(value, datetime):
        return _encode(value)
    if value.tzinfo is None:
        return '"' + value.isoformat(timespec="microseconds") + '+00:00"'
    return '"' + value.astimezone(UTC).isoformat(timespec="microseconds") + '"'


def _json(value: Any) -> str:
    return "null" if value is None else _dumps(value)


def _json_text(value: Any) -> str:
    """A JSONField as a database returns it: JSON text (decoded as JSONField.from_db_value does) or decoded."""
    if value is None:
        return "null"
    return _dumps(_loads(value) if isinstance(value, str) else value)


class Encoder:
    """The canonical bytes of the values at `start`, `start + 1`, ... of a row, in KEYS order.

    The text fields, nearly all of a record's values, are encoded in one call of the C encoder over all of them
    and joined with the others in one str.format; a text field that holds something else (a row edited in the
    database, say) is encoded value by value, as json.dumps would.
    """

    def __init__(self, start: int, *, json_as_text: bool) -> None:
        positions = range(start, start + len(KEYS))
        text = [position for position, name in zip(positions, KEYS, strict=True) if _is_text(name)]
        json_encode = _json_text if json_as_text else _json
        others: list[tuple[int, Callable[[Any], str]]] = [
            (position, _timestamp if name == "created_at" else json_encode if name in JSON_FIELDS else _encode)
            for position, name in zip(positions, KEYS, strict=True)
            if position not in text
        ]
        self._text = itemgetter(*text)
        self._others = tuple(others)
        self._width = start + len(KEYS)
        slot = {position: index for index, position in enumerate([*text, *(position for position, _ in others)])}
        by_key = sorted(zip(KEYS, positions, strict=True))
        pairs = ",".join(f"{encode_basestring(name)}:{{{slot[position]}}}" for name, position in by_key)
        self._template = "{{" + pairs + "}}"

    def __call__(self, row: Sequence[Any]) -> bytes:
        if len(row) != self._width:
            raise ValueError(f"expected {self._width} values, got {len(row)}")
        texts = self._text(row)
        try:
            encoded = list(map(encode_basestring, texts))
        except TypeError:
            encoded = [_encode(value) for value in texts]
        encoded.extend([encode(row[position]) for position, encode in self._others])
        return self._template.format(*encoded).encode("utf-8")


_RECORD = Encoder(0, json_as_text=False)


def canonical_bytes(values: Iterable[Any], prev_mac: str) -> bytes:
    """The canonical bytes of a record's CHAINED_FIELDS values (Python values, as the record holds them)."""
    row = (*values, prev_mac)
    if len(row) != len(KEYS):
        raise ValueError(f"expected {len(CHAINED_FIELDS)} values, got {len(row) - 1}")
    return _RECORD(row)


def record_values(record: AuditRecord) -> list[Any]:
    return [getattr(record, name) for name in CHAINED_FIELDS]


def compute_mac(key: bytes, values: Iterable[Any], prev_mac: str) -> str:
    return hmac.new(key, canonical_bytes(values, prev_mac), hashlib.sha256).hexdigest()


class Mac:
    """HMAC-SHA-256 under one key, for many messages: the key's inner and outer hash states (RFC 2104) are computed
    once and copied per message instead of per hmac.new() call. Gives hmac.new()'s hexdigest."""

    def __init__(self, key: bytes) -> None:
        block = hashlib.sha256().block_size
        key = (hashlib.sha256(key).digest() if len(key) > block else key).ljust(block, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in key))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in key))

    def hexdigest(self, message: bytes) -> str:
        inner, outer = self._inner.copy(), self._outer.copy()
        inner.update(message)
        outer.update(inner.digest())
        return outer.hexdigest()
