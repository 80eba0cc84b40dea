"""Verification of the chain: every stored row encoded again (audit.log.encoding), its mac recomputed, the head checked."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from audit.log import chain
from audit.log.chain import GENESIS_MAC
from audit.log.encoding import CHAINED_FIELDS, Encoder, Mac
from audit.models import AuditRecord, ChainCheckpoint

CATCH_UP_ROUNDS = 5
# A stored row: id, mac, then the encoded values in the order the encoder reads them (its prev_mac last).
_COLUMNS = ("id", "mac", *CHAINED_FIELDS, "prev_mac")
_stored_bytes = Encoder(2, json_as_text=True)


@dataclass
class VerifyResult:
    checked: int
    first_bad_id: int | None = None
    problem: str = ""
    last_id: int | None = None

    @property
    def ok(self) -> bool:
        return self.first_bad_id is None


def _rows(chunk: int, after_id: int) -> Generator[Sequence[Any], None, None]:
    """Raw rows of `_COLUMNS` after `after_id`, in id order, as the database cursor returns them."""
    records = AuditRecord.objects.filter(id__gt=after_id).order_by("id")
    sql, params = records.values_list(*_COLUMNS).query.sql_with_params()
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(chunk):
            yield from rows


@dataclass
class _Walk:
    """Where a walk along the chain has got to."""

    expected_prev: str
    last_id: int | None
    checked: int = 0


def _walk(walk: _Walk, keyed: Mac, chunk: int, after_id: int) -> VerifyResult | None:
    """Check every record after `after_id`, in id order; the first bad one ends the walk."""
    with contextlib.closing(_rows(chunk, after_id)) as rows:
        return _check_rows(walk, keyed, rows)


def _check_rows(walk: _Walk, keyed: Mac, rows: Iterator[Sequence[Any]]) -> VerifyResult | None:
    for row in rows:
        record_id, mac, prev_mac = row[0], row[1], row[-1]
        if prev_mac != walk.expected_prev:
            before = f"record {walk.last_id}" if walk.last_id else "the genesis"
            problem = f"its prev_mac does not match the mac of {before}, the one before it (deleted or reordered)"
            return VerifyResult(walk.checked, record_id, problem, walk.last_id)
        try:
            content = _stored_bytes(row)
        except (ValueError, TypeError) as error:
            return VerifyResult(walk.checked, record_id, f"its content is unreadable ({error})", walk.last_id)
        if not hmac.compare_digest(mac, keyed.hexdigest(content)):
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
        problem = (
            f"the chain head names record {head_id}, but the chain ends at record {last} (the newest were deleted)"
        )
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
        head_mac, head_id = chain.chain_head()
        if head_mac == walk.expected_prev:
            return VerifyResult(walk.checked, last_id=walk.last_id)
        if head_id <= (walk.last_id or 0) or (round_number and walk.checked == walked_before):
            break  # the head is behind the chain, or names records that are gone
        after_id = walk.last_id or 0
    return _head_problem(walk, head_mac, head_id)
