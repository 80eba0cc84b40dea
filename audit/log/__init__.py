"""The audit log: records written through one writer to a keyed hash chain, and the chain's verification.

records.py        Actor and the records (started, finished, event), built from plain data
write.py          event/aevent, call_started/acall_started, acall_read, ...: records built and committed
held.py           finished records the database refused, kept (memory, spill file) and written again
writer.py         the one writer: on the caller's thread or by its batch thread, built at start-up
caller_thread.py  SQLite: a record committed on the event loop's thread when nothing has to wait
append.py         the SQL of an append
encoding.py       the canonical form of a record and its keyed mac
chain.py          the chain head
verify.py         the walk that checks every record and the head
"""

from audit.log.chain import GENESIS_MAC, chain_head, lock_head
from audit.log.encoding import CHAINED_FIELDS, Mac, canonical_bytes, compute_mac
from audit.log.records import Actor, event_record, finished_record, request_actor, started_record
from audit.log.verify import VerifyResult, verify
from audit.log.write import (
    acall_denied,
    acall_finished,
    acall_read,
    acall_started,
    aevent,
    afinish_call,
    call_denied,
    call_finished,
    call_started,
    event,
)
from audit.log.writer import AuditWriter, close, configure, reset

__all__ = [
    "CHAINED_FIELDS",
    "GENESIS_MAC",
    "Actor",
    "AuditWriter",
    "Mac",
    "VerifyResult",
    "acall_denied",
    "acall_finished",
    "acall_read",
    "afinish_call",
    "acall_started",
    "aevent",
    "call_denied",
    "call_finished",
    "call_started",
    "canonical_bytes",
    "chain_head",
    "close",
    "compute_mac",
    "configure",
    "event",
    "event_record",
    "finished_record",
    "lock_head",
    "request_actor",
    "reset",
    "started_record",
    "verify",
]
