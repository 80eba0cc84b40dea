"""Per-credential limits at /mcp: requests per minute, and tool calls in flight.

One worker counts in its own memory (these classes); several workers count together in Redis
(mcpserver.shared_limits), behind the same two async methods, `admit` and `acquire`. They protect the host from one
runaway agent; they are not accounting.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

WINDOW_SECONDS = 60.0


class RateLimiter:
    """A sliding one-minute window per credential. A limit of 0 turns it off."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._hits: dict[str, deque[float]] = {}

    def check(self, key: str) -> float:
        """Count one request; 0 if it may proceed, otherwise the seconds until it may (for Retry-After)."""
        if self.per_minute <= 0:
            return 0.0
        now = self._clock()
        hits = self._hits.setdefault(key, deque())
        while hits and now - hits[0] >= WINDOW_SECONDS:
            hits.popleft()
        if len(hits) >= self.per_minute:
            return max(WINDOW_SECONDS - (now - hits[0]), 0.001)
        hits.append(now)
        return 0.0

    async def admit(self, key: str) -> float:
        return self.check(key)

    @staticmethod
    def retry_after_header(wait: float) -> str:
        return str(max(1, math.ceil(wait)))


class CallSlot(Protocol):
    """One tool call's place under its credential's concurrency limit, held until released."""

    async def release(self) -> None: ...


@dataclass(eq=False)
class _MemorySlot:
    limiter: ConcurrencyLimiter
    key: str
    released: bool = False

    async def release(self) -> None:
        if not self.released:
            self.released = True
            self.limiter.release(self.key)


class ConcurrencyLimiter:
    """At most `limit` tool calls in flight per credential; a call over it is refused, not queued."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_flight: dict[str, int] = {}

    def try_acquire(self, key: str) -> bool:
        count = self._in_flight.get(key, 0)
        if count >= self.limit:
            return False
        self._in_flight[key] = count + 1
        return True

    async def acquire(self, key: str) -> CallSlot | None:
        """A place for one more call of `key`, or None at the limit."""
        return _MemorySlot(self, key) if self.try_acquire(key) else None

    def release(self, key: str) -> None:
        count = self._in_flight.get(key, 0) - 1
        if count > 0:
            self._in_flight[key] = count
        else:
            self._in_flight.pop(key, None)


class RequestLimit(Protocol):
    """Requests per minute per credential: `admit` counts one and answers 0, or the seconds until one may."""

    per_minute: int

    async def admit(self, key: str) -> float: ...


class CallLimit(Protocol):
    """Tool calls in flight per credential: `acquire` holds a place, or answers None at the limit."""

    limit: int

    async def acquire(self, key: str) -> CallSlot | None: ...


class LimitsUnavailable(Exception):
    """The shared limits cannot be counted (Redis does not answer): the request is refused, never let through."""
