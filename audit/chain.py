"""The keyed hash chain: each record's mac covers its canonical content and the previous record's mac."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from json.encoder import encode_basestring
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils.dateparse import parse_datetime

from audit.models import AuditRecord, ChainCheckpoint, ChainHead

GENESIS_MAC = "0" * 64
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
CATCH_UP_ROUNDS = 5

# The canonical form is json.dumps({**content, "prev_mac": ...}, sort_keys=True, separators=(",", ":"),
# ensure_ascii=False). It is built here key by key in sorted order, which gives the same bytes several times faster.
_KEYS = (*CHAINED_FIELDS, "prev_mac")
_SORTED = sorted(range(len(_KEYS)), key=_KEYS.__getitem__)
_PLAN = tuple((f"{encode_basestring(_KEYS[index])}:", index) for index in _SORTED)
_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _canonical_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat(timespec="microseconds")
    return value


def _encode(value: Any) -> str:
    """One value exactly as the canonical json.dumps writes it."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is str:
        return encode_basestring(value)
    if kind is int:
        return int.__repr__(value)
    return _dumps(_canonical_value(value))


def canonical_bytes(values: Iterable[Any], prev_mac: str) -> bytes:
    row = (*values, prev_mac)
    if len(row) != len(_KEYS):
        raise ValueError(f"expected {len(CHAINED_FIELDS)} values, got {len(row) - 1}")
    return ("{" + ",".join([prefix + _encode(row[index]) for prefix, index in _PLAN]) + "}").encode("utf-8")


def compute_mac(key: bytes, values: Iterable[Any], prev_mac: str) -> str:
    return hmac.new(key, canonical_bytes(values, prev_mac), hashlib.sha256).hexdigest()


class Mac:
    """HMAC-SHA-256 under one key, for many messages: the key's inner and outer hash states (RFC 2104) are computed
    once and copied per message, which costs half what hmac.new() does each time. Gives hmac.new()'s hexdigest."""

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


def record_values(record: AuditRecord) -> list[Any]:
    return [getattr(record, name) for name in CHAINED_FIELDS]


def lock_head() -> ChainHead:
    """The chain head, locked until the surrounding transaction ends: whoever holds it is the chain's only writer.

    On PostgreSQL the row lock is what serialises writers (SQLite's IMMEDIATE transactions already do), and the
    row must exist to be locked: two first writers could otherwise both start from the genesis. The head of an
    empty chain is the genesis mac with record 0, which is also what chain_head() reports when there is no row.
    """
    head = ChainHead.objects.select_for_update().filter(pk=1).first()
    if head is None:
        # Whoever inserts second waits here for the first to commit, then inserts nothing.
        ChainHead.objects.bulk_create([ChainHead(pk=1, mac=GENESIS_MAC, last_record_id=0)], ignore_conflicts=True)
        head = ChainHead.objects.select_for_update().get(pk=1)
    return head


def chain_head() -> tuple[str, int]:
    head = ChainHead.objects.filter(pk=1).first()
    return (head.mac, head.last_record_id) if head else (GENESIS_MAC, 0)


@dataclass
class VerifyResult:
    checked: int
    first_bad_id: int | None = None
    problem: str = ""
    last_id: int | None = None

    @property
    def ok(self) -> bool:
        return self.first_bad_id is None


# --- verification: raw database rows, canonicalised without the ORM's per-value converters -----------------------


def _encode_db_timestamp(value: Any) -> str:
    """A created_at as a database cursor returns it: a datetime (naive means UTC, as Django stores it) or text."""
    if isinstance(value, str):
        value = parse_datetime(value)
        if value is None:
            raise ValueError("unreadable created_at")
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return _encode(value)


def _encode_db_json(value: Any) -> str:
    """A JSONField as the database returns it: JSON text, decoded as Django's JSONField.from_db_value does."""
    if value is None:
        return "null"
    return _dumps(json.loads(value) if isinstance(value, str) else value)


_ROW_COLUMNS = ("id", "prev_mac", "mac", *CHAINED_FIELDS)
_ROW_PLAN: tuple[tuple[str, int, Callable[[Any], str]], ...] = tuple(
    (prefix, 1 if index == len(CHAINED_FIELDS) else index + 3,
     _encode_db_timestamp if _KEYS[index] == "created_at" else _encode_db_json if _KEYS[index] in JSON_FIELDS else _encode)
    for prefix, index in _PLAN
)  # fmt: skip


def row_bytes(row: Sequence[Any]) -> bytes:
    """Canonical bytes of a raw row of `_ROW_COLUMNS` (its own prev_mac included)."""
    return ("{" + ",".join([prefix + encode(row[column]) for prefix, column, encode in _ROW_PLAN]) + "}").encode("utf-8")


def _rows(chunk: int, after_id: int = 0, upto_id: int | None = None) -> Iterator[Sequence[Any]]:
    records = AuditRecord.objects.filter(id__gt=after_id).order_by("id")
    if upto_id is not None:
        records = records.filter(id__lte=upto_id)
    sql, params = records.values_list(*_ROW_COLUMNS).query.sql_with_params()
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(chunk):
            yield from rows


def _exact_bytes(record_id: int) -> bytes:
    for row in _rows(1, record_id - 1, record_id):
        return row_bytes(row)
    raise ValueError("the record vanished during the walk")


# --- SQLite fast path: SQLite's json_object() writes the plain columns in C, exactly as json.dumps would; Python
# adds the JSON fields and the HMAC. A row whose fast bytes do not match its mac is re-checked the exact way above,
# so a difference between the two encoders can cost time but never a verdict. ------------------------------------

_SQLITE_DATE = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]"


def _sqlite_column(name: str) -> str:
    column = connection.ops.quote_name(AuditRecord._meta.get_field(name).column)
    if name != "created_at":
        return column
    # Django stores naive UTC text ("YYYY-MM-DD HH:MM:SS[.ffffff]"); anything else gives NULL and the exact path.
    iso = f"substr({column}, 1, 10) || 'T' || substr({column}, 12)"
    return (
        f"CASE WHEN {column} GLOB '{_SQLITE_DATE}' THEN {iso} || '.000000+00:00' "
        f"WHEN {column} GLOB '{_SQLITE_DATE}.[0-9][0-9][0-9][0-9][0-9][0-9]' THEN {iso} || '+00:00' END"
    )


def _sqlite_plan() -> tuple[str, tuple[tuple[str, int, bool], ...]]:
    """The SELECT for the fast path, and how its columns join into the canonical text: (prefix, column, is JSON).

    Runs of plain columns become one json_object() each, its braces cut off in Python.
    """
    select = ["id", "prev_mac", "mac"]
    plan: list[tuple[str, int, bool]] = []
    plain: list[str] = []
    for key in (*sorted(_KEYS), None):
        if plain and (key is None or key in JSON_FIELDS):
            pairs = ", ".join(f"'{name}', {_sqlite_column(name)}" for name in plain)
            select.append(f"json_object({pairs})")
            plan.append(("", len(select) - 1, False))
            plain = []
        if key in JSON_FIELDS:
            select.append(_sqlite_column(key))
            plan.append((f'"{key}":', len(select) - 1, True))
        elif key is not None:
            plain.append(key)
    table = connection.ops.quote_name(AuditRecord._meta.db_table)
    return f"SELECT {', '.join(select)} FROM {table} WHERE id > %s ORDER BY id", tuple(plan)


def _sqlite_rows(chunk: int, after_id: int) -> Iterator[tuple[int, str, str, bytes]]:
    sql, plan = _sqlite_plan()
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [after_id])
        while rows := cursor.fetchmany(chunk):
            for row in rows:
                try:
                    parts = [
                        prefix + _encode_db_json(row[column]) if is_json else row[column][1:-1]
                        for prefix, column, is_json in plan
                    ]
                except (ValueError, TypeError):  # not JSON, or not text: the exact path names the problem
                    yield row[0], row[1], row[2], None
                    continue
                yield row[0], row[1], row[2], ("{" + ",".join(parts) + "}").encode("utf-8")


def _content_rows(chunk: int, after_id: int) -> Generator[tuple[int, str, str, bytes | None], None, None]:
    """(id, prev_mac, mac, canonical bytes or None when they need the exact path) of every record after `after_id`."""
    if connection.vendor == "sqlite":
        yield from _sqlite_rows(chunk, after_id)
        return
    for row in _rows(chunk, after_id):
        try:
            yield row[0], row[1], row[2], row_bytes(row)
        except (ValueError, TypeError):
            yield row[0], row[1], row[2], None


def _mac_matches(keyed: Mac, mac: str, content: bytes | None, record_id: int) -> bool:
    if content is not None and hmac.compare_digest(mac, keyed.hexdigest(content)):
        return True
    return hmac.compare_digest(mac, keyed.hexdigest(_exact_bytes(record_id)))


@dataclass
class _Walk:
    """Where a walk along the chain has got to."""

    expected_prev: str
    last_id: int | None
    checked: int = 0


def _walk(walk: _Walk, keyed: Mac, chunk: int, after_id: int) -> VerifyResult | None:
    """Check every record after `after_id`, in id order; the first bad one ends the walk."""
    with contextlib.closing(_content_rows(chunk, after_id)) as rows:
        return _check_rows(walk, keyed, rows)


def _check_rows(walk: _Walk, keyed: Mac, rows: Iterator[tuple[int, str, str, bytes | None]]) -> VerifyResult | None:
    for record_id, prev_mac, mac, content in rows:
        if prev_mac != walk.expected_prev:
            before = f"record {walk.last_id}" if walk.last_id else "the genesis"
            problem = f"its prev_mac does not match the mac of {before}, the one before it (deleted or reordered)"
            return VerifyResult(walk.checked, record_id, problem, walk.last_id)
        try:
            matches = _mac_matches(keyed, mac, content, record_id)
        except (ValueError, TypeError) as error:
            return VerifyResult(walk.checked, record_id, f"its content is unreadable ({error})", walk.last_id)
        if not matches:
            return VerifyResult(walk.checked, record_id, "its content does not match its mac (edited)", walk.last_id)
        walk.expected_prev, walk.last_id = mac, record_id
        walk.checked += 1
    return None


def _head_problem(walk: _Walk, head_mac: str, head_id: int) -> VerifyResult:
    last = walk.last_id or 0
    if head_id == 0:
        problem = "the chain head is missing, but records (or a prune checkpoint) exist"
        return VerifyResult(walk.checked, last, problem, walk.last_id)
    if head_id > last:
        problem = f"the chain head names record {head_id}, but the chain ends at record {last} (the newest were deleted)"
    elif head_id == last:
        problem = "the chain head's mac does not match this record (the head or the newest record was replaced)"
    else:
        problem = f"the chain head names this record, but the chain goes on to record {last} (records added around it)"
    return VerifyResult(walk.checked, head_id, problem, walk.last_id)


def verify(chunk: int = 5000) -> VerifyResult:
    """Walk the whole chain from the genesis (or the newest prune checkpoint), recompute every mac, check the head.

    Records appended while the walk runs are walked too, a few rounds at most, until the walk reaches the head.
    """
    keyed = Mac(settings.AUDIT_HMAC_KEY)
    checkpoint = ChainCheckpoint.objects.order_by("-last_pruned_id").first()
    walk = _Walk(GENESIS_MAC, None)
    if checkpoint is not None:
        walk = _Walk(checkpoint.last_pruned_mac, checkpoint.last_pruned_id)
    after_id = 0
    for round_number in range(CATCH_UP_ROUNDS):
        walked_before = walk.checked
        if (bad := _walk(walk, keyed, chunk, after_id)) is not None:
            return bad
        head_mac, head_id = chain_head()
        if head_mac == walk.expected_prev:
            return VerifyResult(walk.checked, last_id=walk.last_id)
        if head_id <= (walk.last_id or 0) or (round_number and walk.checked == walked_before):
            break  # the head is behind the chain, or names records that are gone
        after_id = walk.last_id or 0
    return _head_problem(walk, head_mac, head_id)
