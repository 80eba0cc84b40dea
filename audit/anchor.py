"""The chain head, anchored outside the database: one authenticated line a minute in `<state dir>/audit_anchors`.

The chain proves that no record in it was changed, but not that none was cut off its end: whoever can write the
database can delete the newest records and set the head back (or empty the log), and the shorter chain verifies.
So the server appends the head to a file every minute, at start and at shut-down, and audit_prune after a prune;
audit_verify then checks that the chain still reaches the newest head ever anchored.

Each line is `v1 <time> <record id> <mac> <hmac>`, the hmac keyed by the audit key: without the key nobody can add
a line that verifies. Lines are appended with one write() to a file opened O_APPEND, so the lines of several server
processes sharing the state dir never interleave; readers take the anchor naming the highest record, so the order
in which processes wrote does not matter.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from audit.chain import VerifyResult, chain_head, verify
from audit.models import AuditRecord, ChainCheckpoint

logger = logging.getLogger(__name__)
VERSION = "v1"
_DOMAIN = b"sandstorm audit anchor "  # keeps an anchor's hmac from ever equalling a record's mac


@dataclass(frozen=True)
class Anchor:
    at: str  # ISO 8601, UTC
    record_id: int
    mac: str
    line: int = 0  # 1-based line number in the file it was read from


def _hmac(key: bytes, body: str) -> str:
    return hmac.new(key, _DOMAIN + body.encode("ascii"), sha256).hexdigest()


def anchor_line(key: bytes, record_id: int, mac: str, at: datetime) -> str:
    body = f"{VERSION} {at.astimezone(UTC).isoformat(timespec='seconds')} {record_id} {mac}"
    return f"{body} {_hmac(key, body)}\n"


def append_anchor(path: Path, key: bytes, record_id: int, mac: str, at: datetime | None = None) -> None:
    """Append one anchor line: a single write() to an O_APPEND file (whole lines, whoever else appends)."""
    data = anchor_line(key, record_id, mac, at or timezone.now()).encode("ascii")
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.write(descriptor, data) != len(data):
            raise OSError(f"short write to {path}")
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def anchor_chain_head() -> tuple[int, str]:
    """Anchor the current chain head (server ticks, audit_prune); returns it. Raises OSError if the file cannot be
    written (the caller logs it: the tool calls go on, and audit_verify says when the newest anchor is)."""
    mac, record_id = chain_head()
    append_anchor(settings.AUDIT_ANCHOR_FILE, settings.AUDIT_HMAC_KEY, record_id, mac)
    return record_id, mac


@dataclass
class AnchorFile:
    newest: Anchor | None = None
    count: int = 0
    forged: list[int] = field(default_factory=list)  # line numbers that are not authentic anchors
    torn: bool = False  # the last line has no newline (a write cut short by a crash or a full disk): ignored


def _parse(key: bytes, text: str, number: int) -> Anchor | None:
    parts = text.split(" ")
    if len(parts) != 5 or parts[0] != VERSION or not parts[2].isdigit():
        return None
    if not hmac.compare_digest(parts[4], _hmac(key, " ".join(parts[:4]))):
        return None
    return Anchor(parts[1], int(parts[2]), parts[3], number)


def read_anchors(path: Path, key: bytes) -> AnchorFile | None:
    """The anchors in `path`, or None if there is no such file (no server has anchored the chain yet)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    found = AnchorFile()
    lines = data.split(b"\n")
    found.torn = lines[-1] != b""
    for number, raw in enumerate(lines[:-1], start=1):
        anchor = _parse(key, raw.decode("ascii", errors="replace"), number)
        if anchor is None:
            found.forged.append(number)
            continue
        found.count += 1
        if found.newest is None or anchor.record_id >= found.newest.record_id:
            found.newest = anchor
    return found


@dataclass(frozen=True)
class AnchorCheck:
    ok: bool
    message: str


def _describe(lines: Iterable[int]) -> str:
    numbers = list(lines)
    shown = ", ".join(str(number) for number in numbers[:5])
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def verify_anchored() -> tuple[VerifyResult, AnchorCheck | None]:
    """Walk the chain (audit.chain.verify) and, if it verifies, check it against the anchor file.

    The file is read before the walk: every head anchored by then was committed by then, so a chain that has not
    lost records reaches it (the walk catches up with records appended meanwhile).
    """
    path = settings.AUDIT_ANCHOR_FILE
    anchors = read_anchors(path, settings.AUDIT_HMAC_KEY)
    result = verify()
    if not result.ok:
        return result, None
    return result, check_anchor(result, anchors, path)


def check_anchor(result: VerifyResult, anchors: AnchorFile | None, path: Path) -> AnchorCheck:
    """Whether a chain that verified (`result`) still reaches the newest anchored head in `anchors`."""
    if anchors is None or (anchors.newest is None and not anchors.forged):
        return AnchorCheck(True, f"No anchor yet in {path}: the newest records could not be checked against one.")
    if anchors.forged:
        return AnchorCheck(
            False,
            f"line {_describe(anchors.forged)} of {path} is not an anchor written with this audit key "
            "(edited or forged); keep the file as evidence",
        )
    newest = anchors.newest
    assert newest is not None
    if newest.record_id == 0:
        return AnchorCheck(True, f"The last anchor ({newest.at}, line {newest.line} of {path}) is of an empty chain.")
    checkpoint = ChainCheckpoint.objects.order_by("-last_pruned_id").first()
    pruned_to = checkpoint.last_pruned_id if checkpoint else 0
    end = result.last_id or pruned_to
    where = f"record {newest.record_id}, anchored at {newest.at} (line {newest.line} of {path})"
    if newest.record_id > end:
        return AnchorCheck(
            False,
            f"{newest.record_id - end} records missing after the last anchor: the chain ends at record {end}, but "
            f"the chain head was {where}. The newest records were deleted, or the database was restored from a "
            f"backup older than that (then these are the records written since the backup: keep {path} as evidence "
            "and move it aside; the server starts a new one)",
        )
    if newest.record_id <= pruned_to:
        assert checkpoint is not None
        if newest.record_id == pruned_to and hmac.compare_digest(newest.mac, checkpoint.last_pruned_mac):
            return AnchorCheck(True, f"The chain reaches the last anchor ({where}, where the prune checkpoint is).")
        return AnchorCheck(
            False,
            f"the last anchor ({where}) lies in the part a prune checkpoint says was removed (up to record "
            f"{pruned_to}), but audit_prune anchors the head after every prune: the checkpoint is not audit_prune's, "
            "or lines were removed from the anchor file",
        )
    mac = AuditRecord.objects.filter(id=newest.record_id).values_list("mac", flat=True).first()
    if mac is None or not hmac.compare_digest(mac, newest.mac):
        state = "is gone" if mac is None else "has another mac"
        return AnchorCheck(
            False, f"the anchored record {state}: {where} (the newest records were deleted and others written since)"
        )
    return AnchorCheck(True, f"The chain reaches the last anchor ({where}).")
