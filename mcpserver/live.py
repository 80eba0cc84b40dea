"""What agents are doing now, for the console's Live page and its approval cards: the calls running in this
process (with the tail of their output), and changes to approval requests and background commands.

Changes are collected and sent to the channel-layer group GROUP at most every FLUSH_SECONDS, as one batch: a
burst of calls or a command printing fast costs the pages one message per interval, not one per line. A page that
opens later gets `snapshot()` first. Everything here runs on the server's event loop; the `*_threadsafe` forms
are for the console's synchronous views.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.utils import timezone

from mcpserver.stop_reasons import CONSOLE, StopNote, Stopped

logger = logging.getLogger(__name__)
GROUP = "sandstorm.console"
FLUSH_SECONDS = 0.15
OUTPUT_TAIL = 16 * 1024  # characters of output kept per call, for a page opened while it runs
BATCH_OUTPUT = 32 * 1024  # characters of one call's output per batch (a flood keeps its newest part)
SUMMARY_CHARS = 2000
ENDED_KEPT = 20  # ended calls a page opened later still shows (the newest)


@dataclass(eq=False)
class LiveCall:
    call_id: str
    tool: str
    summary: str
    username: str
    credential_name: str
    credential_key: str
    address: str
    started_at: str = field(default_factory=lambda: timezone.now().isoformat())
    description: str = ""  # the agent's words on what the command is for
    state: str = "running"  # or "awaiting_approval"
    approval: str = ""  # the request's label while it waits
    output: str = ""
    output_units: int = 0  # how much output came in all, in UTF-16 code units (a page's string length)
    outcome: str = ""  # once it has ended
    seconds: float | None = None  # how long it ran, once it has ended
    began: float = field(default_factory=time.monotonic)
    scope: anyio.CancelScope | None = field(default=None, repr=False)
    note: StopNote = field(default_factory=StopNote, repr=False)

    def public(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "summary": self.summary[:SUMMARY_CHARS],
            "description": self.description,
            "username": self.username,
            "credential_name": self.credential_name,
            "credential_key": self.credential_key,
            "address": self.address,
            "started_at": self.started_at,
            "elapsed": round(time.monotonic() - self.began, 1) if self.seconds is None else self.seconds,
            "state": "ended" if self.outcome else self.state,
            "outcome": self.outcome,
            "output_units": self.output_units,
            "approval": self.approval,
            "output": self.output,
        }


@dataclass
class _Batch:
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # started or changed: their fields
    output: dict[str, str] = field(default_factory=dict)  # appended since the last batch
    output_units: dict[str, int] = field(default_factory=dict)  # call id: its output in all after this batch's
    ended: dict[str, str] = field(default_factory=dict)  # call id: outcome
    seconds: dict[str, float] = field(default_factory=dict)  # call id: how long it ran, for those that ended
    approvals: dict[int, dict[str, Any]] = field(default_factory=dict)
    background: bool = False  # the background commands changed: pages reload that list

    def empty(self) -> bool:
        return not (self.calls or self.output or self.ended or self.approvals or self.background)

    def message(self) -> dict[str, Any]:
        return {
            "type": "live.batch",
            "calls": list(self.calls.values()),
            "output": self.output,
            "output_units": self.output_units,
            "ended": self.ended,
            "seconds": self.seconds,
            "approvals": list(self.approvals.values()),
            "background": self.background,
        }


class LiveFeed:
    def __init__(self) -> None:
        self.calls: dict[str, LiveCall] = {}
        self.ended_calls: deque[LiveCall] = deque(maxlen=ENDED_KEPT)
        self._batch = _Batch()
        self._flushing: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self.batches_sent = 0

    # --- what happens --------------------------------------------------------------------------------------------

    def started(self, call: LiveCall) -> None:
        self.calls[call.call_id] = call
        self._batch.calls[call.call_id] = call.public()
        self._schedule()

    def changed(self, call_id: str, **fields: Any) -> None:
        call = self.calls.get(call_id)
        if call is None:
            return
        for name, value in fields.items():
            setattr(call, name, value)
        self._batch.calls[call_id] = call.public()
        self._schedule()

    def output(self, call_id: str, text: str) -> None:
        call = self.calls.get(call_id)
        if call is None or not text:
            return
        call.output = (call.output + text)[-OUTPUT_TAIL:]
        call.output_units += len(text.encode("utf-16-le")) // 2
        pending = self._batch.output.get(call_id, "") + text
        self._batch.output[call_id] = pending[-BATCH_OUTPUT:]
        self._batch.output_units[call_id] = call.output_units
        self._schedule()

    def ended(self, call_id: str, outcome: str) -> None:
        call = self.calls.pop(call_id, None)
        if call is None:
            return
        # Its last output stays in the batch: a page shows every byte up to the end, then how it ended.
        self._batch.calls.pop(call_id, None)
        call.outcome, call.seconds = outcome, round(time.monotonic() - call.began, 1)
        self._batch.ended[call_id] = outcome
        self._batch.seconds[call_id] = call.seconds
        if call.output_units or call.seconds >= FLUSH_SECONDS:  # one a page may have shown
            self.ended_calls.append(call)
        self._schedule()

    def approval(self, described: dict[str, Any]) -> None:
        self._batch.approvals[int(described["id"])] = described
        self._schedule()

    def background_changed(self) -> None:
        self._batch.background = True
        self._schedule()

    def threadsafe(self, change: Callable[..., None], *args: Any) -> None:
        """Run a change from another thread (a console view) on the loop the feed serves."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(change, *args)

    # --- what pages see ------------------------------------------------------------------------------------------

    def running(self) -> list[dict[str, Any]]:
        return [call.public() for call in sorted(self.calls.values(), key=lambda call: call.began)]

    def recently_ended(self) -> list[dict[str, Any]]:
        """The newest calls that ended while a page may have shown them, oldest first."""
        return [call.public() for call in self.ended_calls]

    def stop(self, call_id: str, by: str) -> bool:
        """Cancel a running call from the console, as staff user `by` (its command's process group ends with it);
        False if it is not running here."""
        call = self.calls.get(call_id)
        if call is None or call.scope is None:
            return False
        call.note.stop(call.scope, Stopped(CONSOLE, by))
        return True

    # --- sending -------------------------------------------------------------------------------------------------

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a management command): nobody is watching
        if self._flushing is not None and self._loop is loop:
            return  # a flush is due on this loop (one due on a loop that has ended never comes)
        self._loop = loop
        self._flushing = loop.call_later(FLUSH_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flushing = None
        batch, self._batch = self._batch, _Batch()
        if batch.empty():
            return
        task = asyncio.get_running_loop().create_task(self._send(batch.message()))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, message: dict[str, Any]) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            await layer.group_send(GROUP, message)
            self.batches_sent += 1
        except (ChannelFull, OSError):  # a layer that cannot take it must not reach a tool call
            logger.exception("could not send the live view's updates")


LIVE = LiveFeed()
