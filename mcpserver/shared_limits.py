"""The per-credential limits of mcpserver.limits counted in Redis, so that several workers count together.

Each limit is one Lua script, atomic in Redis, timed by Redis's own clock (the workers' clocks never meet):

- requests per minute: a sorted set per credential of the last minute's requests, scored by their time;
- calls in flight, and open sessions (per credential and per user): sorted sets of leases, scored by when each runs
  out. A worker renews its leases while it holds them, so a worker that dies holding some frees them within
  LEASE_SECONDS instead of for ever.

Redis not answering refuses the request (LimitsUnavailable): a limit that fails open is no limit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from mcpserver.limits import WINDOW_SECONDS, CallSlot, LimitsUnavailable
from mcpserver.process import INSTANCE_ID
from mcpserver.sessions import OpenSession, SessionLedger

logger = logging.getLogger(__name__)
LEASE_SECONDS = 60.0  # renewed every quarter of it

# KEYS[1] the credential's set; ARGV: limit, a unique member, window (ms). Returns 0, or the ms until a request may.
_ADMIT = """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local window = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return math.max(window - (now - tonumber(oldest[2])), 1)
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('PEXPIRE', KEYS[1], window)
return 0
"""

# KEYS: the sets a lease goes in (a credential's, a user's); ARGV: a unique member, the lease (ms), then each set's
# limit. Returns 0 if the lease was taken, else the number of the first set at its limit.
_TAKE = """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
for i, key in ipairs(KEYS) do
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    if redis.call('ZCARD', key) >= tonumber(ARGV[i + 2]) then
        return i
    end
end
for i, key in ipairs(KEYS) do
    redis.call('ZADD', key, now + tonumber(ARGV[2]), ARGV[1])
    redis.call('PEXPIRE', key, ARGV[2])
end
return 0
"""

# KEYS: the sets; ARGV[1] the lease (ms), then one member per key. Extends the leases still held.
_RENEW = """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
    redis.call('ZADD', key, 'XX', now + lease, ARGV[i + 1])
    redis.call('PEXPIRE', key, lease)
end
return #KEYS
"""


def connect(url: str) -> Redis:
    """A client for `url`; it opens its connections when first used, on the event loop that uses it."""
    return Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30)


_counter = itertools.count()


def _new_member() -> str:
    """A member no other request or call has, in any worker: this process's instance and a counter."""
    return f"{INSTANCE_ID}:{next(_counter)}"


class SharedRateLimiter:
    """RateLimiter's sliding one-minute window, in Redis. A limit of 0 turns it off."""

    def __init__(self, redis: Redis, prefix: str, per_minute: int) -> None:
        self.per_minute = per_minute
        self._redis = redis
        self._prefix = f"{prefix}:rate:"
        self._script = redis.register_script(_ADMIT)

    async def admit(self, key: str) -> float:
        if self.per_minute <= 0:
            return 0.0
        window_ms = int(WINDOW_SECONDS * 1000)
        try:
            wait_ms = await self._script(keys=[self._prefix + key], args=[self.per_minute, _new_member(), window_ms])
        except RedisError as error:
            raise LimitsUnavailable(f"the rate limit cannot be counted: Redis does not answer ({error})") from error
        return int(wait_ms) / 1000


@dataclass(eq=False)
class Lease:
    """A place held in one or more sets until released, or until its lease runs out unrenewed."""

    leases: Leases
    keys: tuple[str, ...]
    member: str
    _giving_back: asyncio.Future[None] | None = None

    async def release(self) -> None:
        """Give the place back, in a task of its own (a cancelled call, releasing in its `finally`, still gives it
        back); a second release waits for the first, so either caller may count on the place being free."""
        if self._giving_back is None:
            self._giving_back = asyncio.ensure_future(self.leases.give_back(self))
        await asyncio.shield(self._giving_back)


class Leases:
    """Places in sorted sets of Redis, each scored by when it runs out; renewed by this process while it holds them,
    so the places of a worker that died free themselves within `lease_seconds`."""

    def __init__(self, redis: Redis, what: str, lease_seconds: float = LEASE_SECONDS) -> None:
        self.what = what  # for the log and errors: "a call's place", ...
        self.lease_seconds = lease_seconds
        self._redis = redis
        self._take = redis.register_script(_TAKE)
        self._renew = redis.register_script(_RENEW)
        self._held: dict[str, Lease] = {}
        self._renewer: asyncio.Task[None] | None = None

    @property
    def _lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    async def take(self, keys: tuple[str, ...], limits: tuple[int, ...]) -> Lease | int:
        """A lease in every set of `keys`, or the number (1-based) of the first set already at its limit."""
        lease = Lease(self, keys, _new_member())
        try:
            full = int(await self._take(keys=list(keys), args=[lease.member, self._lease_ms, *limits]))
        except RedisError as error:
            raise LimitsUnavailable(f"{self.what} cannot be counted: Redis does not answer ({error})") from error
        if full:
            return full
        self._held[lease.member] = lease
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._keep_renewed())
        return lease

    async def give_back(self, lease: Lease) -> None:
        self._held.pop(lease.member, None)
        try:
            for key in lease.keys:
                await self._redis.zrem(key, lease.member)
        except RedisError as error:  # it runs out by itself
            logger.warning(
                "could not give back %s in Redis (it frees itself within %g s): %s",
                self.what,
                self.lease_seconds,
                error,
            )

    async def _keep_renewed(self) -> None:
        while self._held:
            await asyncio.sleep(self.lease_seconds / 4)
            pairs = [(key, lease.member) for lease in list(self._held.values()) for key in lease.keys]
            if not pairs:
                return
            try:
                await self._renew(
                    keys=[key for key, _ in pairs], args=[self._lease_ms, *(member for _, member in pairs)]
                )
            except RedisError as error:  # tried again soon; a lease outlives three misses
                logger.warning("could not renew %d lease(s) of %s in Redis: %s", len(pairs), self.what, error)


class SharedConcurrencyLimiter:
    """ConcurrencyLimiter's calls in flight per credential, as leases in Redis."""

    def __init__(self, redis: Redis, prefix: str, limit: int, lease_seconds: float = LEASE_SECONDS) -> None:
        self.limit = limit
        self._prefix = f"{prefix}:calls:"
        self.leases = Leases(redis, "a call's place under the concurrency limit", lease_seconds)

    async def acquire(self, key: str) -> CallSlot | None:
        taken = await self.leases.take((self._prefix + key,), (self.limit,))
        return taken if isinstance(taken, Lease) else None


class SharedSessionLedger(SessionLedger):
    """The session caps counted over every worker: each open session holds a lease in its credential's set and its
    user's. At a cap, room is made as one worker alone would (mcpserver.sessions): by ending the credential's least
    recently used idle session, here if it has one, else in another worker (`ask_others`, set by
    mcpserver.application to mcpserver.workers); if none is idle anywhere, the new session is refused."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        *,
        per_credential: int,
        per_user: int,
        unused_timeout: float,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        super().__init__(per_credential=per_credential, per_user=per_user, unused_timeout=unused_timeout)
        self._prefix = f"{prefix}:sessions:"
        self.leases = Leases(redis, "an MCP session's place under the session caps", lease_seconds)
        self.ask_others: Callable[[str], Awaitable[bool]] | None = None

    async def open(self, key: str, user_id: int) -> OpenSession | str:
        keys = (f"{self._prefix}credential:{key}", f"{self._prefix}user:{user_id}")
        for attempt in range(2):
            taken = await self.leases.take(keys, (self.per_credential, self.per_user))
            if isinstance(taken, Lease):
                entry = self.add(key, user_id)
                entry.lease = taken
                return entry
            if attempt == 0 and await self._make_room(key):
                continue
            return self.refusal(credential_full=taken == 1)
        raise AssertionError("unreachable")

    async def _make_room(self, key: str) -> bool:
        ended = self.end_idle(key)
        if ended is not None:
            if ended.lease is not None:
                await ended.lease.release()
            return True
        return self.ask_others is not None and await self.ask_others(key)
