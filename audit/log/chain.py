"""The keyed hash chain: each record's mac covers its canonical content and the previous record's mac."""

from __future__ import annotations

from audit.models import ChainHead

GENESIS_MAC = "0" * 64


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
