"""Messages between the workers of one installation (docs/scaling.md), over Redis's channel layer.

Each worker joins GROUP with a channel of its own and answers:

- `workers.revoked`: a credential was revoked somewhere: apply it now (mcpserver.revocations), not at the next poll;
- `workers.stop_call`: stop this call if it runs here, and say so to `reply_to`;
- `workers.end_idle_session` (sent to one worker's own group): end the least recently used idle session of a
  credential at its session cap, and say whether it had one (mcpserver.shared_limits.SharedSessionLedger);
- `workers.snapshot`: send the calls running here, with their output so far, to the console page at `reply_to`
  (which has those of its own worker already);
- `workers.list_sessions`: send the MCP sessions open here to the console's sessions page at `reply_to`;
- `workers.end_session` (sent to one worker's own group): end this MCP session if it is open here, for `by`, and
  say which it was (mcpserver.open_sessions).

One worker alone (the in-memory layer, `make run`) has nobody to tell: `shared()` is false and nothing is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from redis.exceptions import RedisError

from mcpserver.live import LIVE
from mcpserver.open_sessions import Row, end_here, rows_here
from mcpserver.process import INSTANCE_ID
from mcpserver.sessions import SessionLedger

logger = logging.getLogger(__name__)
GROUP = "sandstorm.workers"
ANSWER_SECONDS = 2.0
_LAYER_ERRORS = (ChannelFull, OSError, RedisError)
_pending: set[asyncio.Task[None]] = set()  # announcements sent from the event loop, until sent


def shared() -> BaseChannelLayer | None:
    """The channel layer the workers share, or None where this process is the only worker."""
    return get_channel_layer() if settings.REDIS_URL else None


async def tell_workers(message: dict[str, Any]) -> None:
    """Send `message` to every worker; a layer that cannot take it is logged (what it says is also found by polls
    or comes again)."""
    layer = shared()
    if layer is None:
        return
    try:
        await layer.group_send(GROUP, message)
    except _LAYER_ERRORS as error:
        logger.warning("could not tell the other workers (%s): %s", message.get("type"), error)


def announce_revocation() -> None:
    """Tell every worker that a revocation was committed (from any thread: a console view, a management command)."""
    if shared() is None:
        return
    message = {"type": "workers.revoked"}
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        from asgiref.sync import async_to_sync

        async_to_sync(tell_workers)(message)  # the workers' polls find it anyway (revocations.POLL_SECONDS)
        return
    task = loop.create_task(tell_workers(message))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def ask_workers_to_stop(call_id: str, by: str) -> dict[str, Any] | None:
    """Ask every worker to stop call `call_id`, for staff user `by`; the answer of the one running it (its tool and
    user), or None."""
    layer = shared()
    if layer is None:
        return None
    try:
        reply_to = await layer.new_channel()
        message = {"type": "workers.stop_call", "call_id": call_id, "reply_to": reply_to, "by": by}
        await layer.group_send(GROUP, message)
        answer = await asyncio.wait_for(layer.receive(reply_to), ANSWER_SECONDS)
    except TimeoutError:
        return None
    except _LAYER_ERRORS as error:
        logger.warning("could not ask the other workers to stop call %s: %s", call_id, error)
        return None
    return answer if isinstance(answer, dict) else None


def worker_group(number: int) -> str:
    return f"{GROUP}.{number}"


async def ask_workers_to_end_idle_session(key: str) -> bool:
    """Ask the other workers, one at a time, to end an idle session of credential `key`; whether one did."""
    layer = shared()
    if layer is None:
        return False
    for number in range(1, settings.WORKERS + 1):
        if number == settings.WORKER:
            continue
        try:
            reply_to = await layer.new_channel()
            request = {"type": "workers.end_idle_session", "key": key, "reply_to": reply_to}
            await layer.group_send(worker_group(number), request)
            answer = await asyncio.wait_for(layer.receive(reply_to), ANSWER_SECONDS)
        except (TimeoutError, *_LAYER_ERRORS) as error:
            logger.warning("worker %d did not say whether it holds an idle session of %s: %r", number, key, error)
            continue
        if isinstance(answer, dict) and answer.get("ended"):
            return True
    return False


async def ask_workers_for_sessions() -> tuple[list[Row], list[int]]:
    """The MCP sessions the other workers hold, and the numbers of those that did not answer in time."""
    layer = shared()
    others = [number for number in range(1, settings.WORKERS + 1) if number != settings.WORKER]
    if layer is None or not others:
        return [], []
    rows: list[Row] = []
    answered: set[int] = set()
    try:
        reply_to = await layer.new_channel()
        await layer.group_send(GROUP, {"type": "workers.list_sessions", "reply_to": reply_to, "from": INSTANCE_ID})
        async with asyncio.timeout(ANSWER_SECONDS):
            while not answered.issuperset(others):
                answer = await layer.receive(reply_to)
                if isinstance(answer, dict) and isinstance(answer.get("sessions"), list):
                    answered.add(int(answer.get("worker", 0)))
                    rows += [row for row in answer["sessions"] if isinstance(row, dict)]
    except TimeoutError:
        pass
    except _LAYER_ERRORS as error:
        logger.warning("could not ask the other workers for their MCP sessions: %s", error)
    return rows, [number for number in others if number not in answered]


async def ask_worker_to_end_session(number: int, session_id: str, by: str) -> Row | None:
    """Ask worker `number` to end MCP session `session_id` for staff user `by`; the session's row if it did."""
    layer = shared()
    if layer is None:
        return None
    try:
        reply_to = await layer.new_channel()
        request = {"type": "workers.end_session", "session_id": session_id, "by": by, "reply_to": reply_to}
        await layer.group_send(worker_group(number), request)
        answer = await asyncio.wait_for(layer.receive(reply_to), ANSWER_SECONDS)
    except (TimeoutError, *_LAYER_ERRORS) as error:
        logger.warning("worker %d did not say whether it ended MCP session %s: %r", number, session_id[:16], error)
        return None
    session = answer.get("session") if isinstance(answer, dict) else None
    return session if isinstance(session, dict) else None


class WorkerBus:
    """This worker's place in GROUP: started and stopped with the server (mcpserver.application)."""

    def __init__(self, on_revocation: Callable[[], None], sessions: SessionLedger) -> None:
        self.on_revocation = on_revocation
        self.sessions = sessions
        self._task: asyncio.Task[None] | None = None
        self._layer: BaseChannelLayer | None = None
        self._channel = ""

    async def start(self) -> None:
        self._layer = shared()
        if self._layer is not None:  # joined in the task: a Redis still starting does not stop the server's start
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._layer is not None and self._channel:
            with contextlib.suppress(*_LAYER_ERRORS):
                await self._layer.group_discard(GROUP, self._channel)
                await self._layer.group_discard(worker_group(settings.WORKER), self._channel)

    async def _run(self) -> None:
        assert self._layer is not None
        while True:
            try:
                if not self._channel:
                    channel = await self._layer.new_channel()
                    await self._layer.group_add(GROUP, channel)
                    await self._layer.group_add(worker_group(settings.WORKER), channel)
                    self._channel = channel
                message = await self._layer.receive(self._channel)
                await self.handle(message)
            except _LAYER_ERRORS as error:
                logger.warning("the workers' channel failed (%s); listening again in 1 s", error)
                await asyncio.sleep(1)

    async def handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "workers.revoked":
            self.on_revocation()
        elif kind == "workers.stop_call":
            call = LIVE.calls.get(str(message.get("call_id")))
            if call is not None and LIVE.stop(call.call_id, str(message.get("by", ""))):
                answer = {"type": "workers.stopped", "call_id": call.call_id, "tool": call.tool}
                await self._reply(message, {**answer, "summary": call.summary[:500], "username": call.username})
        elif kind == "workers.end_idle_session":
            ended = self.sessions.end_idle(str(message.get("key")))
            if ended is not None and ended.lease is not None:
                await ended.lease.release()  # free in Redis before the asking worker counts again
            await self._reply(message, {"type": "workers.idle_session", "ended": ended is not None})
        elif kind == "workers.list_sessions" and message.get("from") != INSTANCE_ID:  # the page has its own
            rows = rows_here(self.sessions)
            await self._reply(message, {"type": "workers.sessions", "worker": settings.WORKER, "sessions": rows})
        elif kind == "workers.end_session":
            row = await end_here(self.sessions, str(message.get("session_id")), str(message.get("by", "")))
            await self._reply(message, {"type": "workers.session_ended", "session": row})
        elif kind == "workers.snapshot" and message.get("from") != INSTANCE_ID:  # its own are in its snapshot
            running = LIVE.running()
            if running:
                output = {call["call_id"]: call["output"] for call in running}
                await self._reply(message, {"type": "live.batch", "calls": running, "output": output, "ended": {}})

    async def _reply(self, message: dict[str, Any], answer: dict[str, Any]) -> None:
        reply_to = message.get("reply_to")
        if isinstance(reply_to, str) and self._layer is not None:
            await self._layer.send(reply_to, answer)
