"""What the server does around its life: register its instance, finish calls a killed predecessor left open,
heartbeat and anchor the audit chain head (the anchor file and the log) every minute and at shut-down."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError

from audit.anchor import append_anchor
from audit.budget import AuditBudget
from audit.failures import FailureAggregator
from audit.instances import heartbeat, mark_stopped, recover_interrupted, register_instance
from audit.log import Actor, chain_head, event
from mcpserver.instance import INSTANCE_ID

logger = logging.getLogger(__name__)
TICK_SECONDS = 60.0


_anchored: dict[str, tuple[int, str]] = {}  # the head this process last anchored, by anchor file


def log_chain_head() -> None:
    """Anchor the chain head outside the database: in the anchor file, which audit_verify checks, and the log.

    An idle server's head does not move: it is anchored again only when it has (a line a minute would otherwise
    add up to some 90 MB a year per process)."""
    mac, record_id = chain_head()
    logger.info("audit chain head: record %d mac %s", record_id, mac)
    path = str(settings.AUDIT_ANCHOR_FILE)
    if _anchored.get(path) == (record_id, mac):
        return
    try:
        append_anchor(settings.AUDIT_ANCHOR_FILE, settings.AUDIT_HMAC_KEY, record_id, mac)
    except OSError:
        logger.exception("audit: could not append the chain head to %s", settings.AUDIT_ANCHOR_FILE)
        return
    _anchored[path] = (record_id, mac)


def flush_failures(failures: FailureAggregator) -> None:
    for address, count, reasons in failures.drain():
        if count:
            actor = Actor(client_address=address)
            event("auth.failed", actor, instance_id=INSTANCE_ID, count=count, reasons=reasons, aggregated=True)


def flush_budget_refusals(budget: AuditBudget) -> None:
    """One event for the tool calls refused because the audit log is full, instead of a record each."""
    count, state = budget.drain_refused()
    if count:
        detail = state.as_json() if state else {}
        event("audit.full", instance_id=INSTANCE_ID, calls_refused=count, **detail)


class ServerLifecycle:
    def __init__(self, failures: FailureAggregator, budget: AuditBudget) -> None:
        self.failures = failures
        self.budget = budget
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await sync_to_async(register_instance, thread_sensitive=False)(INSTANCE_ID)
        await sync_to_async(recover_interrupted, thread_sensitive=False)(INSTANCE_ID)
        await sync_to_async(log_chain_head, thread_sensitive=False)()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        await sync_to_async(self._final, thread_sensitive=False)()

    def _final(self) -> None:
        flush_failures(self.failures)
        flush_budget_refusals(self.budget)
        mark_stopped(INSTANCE_ID)
        log_chain_head()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                await sync_to_async(self._every_minute, thread_sensitive=False)()
            except DatabaseError:
                logger.exception("audit housekeeping failed; retrying in a minute")

    def _every_minute(self) -> None:
        heartbeat(INSTANCE_ID)
        flush_failures(self.failures)
        flush_budget_refusals(self.budget)
        log_chain_head()
