"""The keyed hash chain: each record's mac covers its canonical content and the previous record's mac."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.conf import settings
from django.db import transaction

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


def _canonical_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat(timespec="microseconds")
    return value


def canonical_bytes(values: Iterable[Any], prev_mac: str) -> bytes:
    content = dict(zip(CHAINED_FIELDS, (_canonical_value(value) for value in values), strict=True))
    content["prev_mac"] = prev_mac
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def compute_mac(key: bytes, values: Iterable[Any], prev_mac: str) -> str:
    return hmac.new(key, canonical_bytes(values, prev_mac), hashlib.sha256).hexdigest()


def record_values(record: AuditRecord) -> list[Any]:
    return [getattr(record, name) for name in CHAINED_FIELDS]


def append(record: AuditRecord) -> AuditRecord:
    """Insert `record` at the head of the chain. Writers serialize on the ChainHead row, so the chain cannot fork."""
    key = settings.AUDIT_HMAC_KEY
    with transaction.atomic():
        head = ChainHead.objects.select_for_update().filter(pk=1).first()
        record.prev_mac = head.mac if head else GENESIS_MAC
        record.mac = compute_mac(key, record_values(record), record.prev_mac)
        record.save(force_insert=True)
        if head is None:
            ChainHead.objects.create(pk=1, mac=record.mac, last_record_id=record.id)
        else:
            ChainHead.objects.filter(pk=1).update(mac=record.mac, last_record_id=record.id)
    return record


def chain_head() -> tuple[str, int]:
    head = ChainHead.objects.filter(pk=1).first()
    return (head.mac, head.last_record_id) if head else (GENESIS_MAC, 0)


@dataclass
class VerifyResult:
    checked: int
    first_bad_id: int | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.first_bad_id is None


def _rows(chunk: int) -> Iterator[tuple[Any, ...]]:
    fields = ("id", "prev_mac", "mac", *CHAINED_FIELDS)
    yield from AuditRecord.objects.order_by("id").values_list(*fields).iterator(chunk_size=chunk)


def verify(chunk: int = 5000) -> VerifyResult:
    """Walk the whole chain from the genesis (or the newest prune checkpoint) and recompute every mac."""
    key = settings.AUDIT_HMAC_KEY
    checkpoint = ChainCheckpoint.objects.order_by("-last_pruned_id").first()
    expected_prev = checkpoint.last_pruned_mac if checkpoint else GENESIS_MAC
    checked = 0
    last_mac = expected_prev
    for row in _rows(chunk):
        record_id, prev_mac, mac = row[0], row[1], row[2]
        if prev_mac != expected_prev:
            return VerifyResult(checked, record_id, "its prev_mac does not match the record before it (deleted or reordered)")
        if not hmac.compare_digest(mac, compute_mac(key, row[3:], prev_mac)):
            return VerifyResult(checked, record_id, "its content does not match its mac (edited)")
        expected_prev = last_mac = mac
        checked += 1
    head_mac, head_id = chain_head()
    if checked and head_mac != last_mac:
        return VerifyResult(checked, head_id, "the newest records are missing (the chain head names a later record)")
    return VerifyResult(checked)
