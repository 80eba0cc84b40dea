"""The per-credential limits counted in Redis (mcpserver.shared_limits): two limiters with clients of their own
stand for two workers; they must count together, free what a dead worker held, and refuse when Redis is gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from redis.asyncio import Redis

from mcpserver.limits import LimitsUnavailable
from mcpserver.sessions import OpenSession
from mcpserver.shared_limits import SharedConcurrencyLimiter, SharedRateLimiter, SharedSessionLedger, connect
from tests.redis_server import unique_prefix
from tests.test_sessions import FakeTransport

pytestmark = [pytest.mark.live]
T = TypeVar("T")


def with_two_workers(redis_url: str, body: Callable[[Redis, Redis], Awaitable[T]]) -> T:
    async def run() -> T:
        first, second = connect(redis_url), connect(redis_url)
        try:
            return await body(first, second)
        finally:
            await first.aclose()
            await second.aclose()

    return asyncio.run(run())


def test_the_rate_limit_counts_the_requests_of_both_workers_together(redis_url: str) -> None:
    prefix = unique_prefix()

    async def body(first: Redis, second: Redis) -> tuple[list[float], list[float], float]:
        a, b = SharedRateLimiter(first, prefix, 6), SharedRateLimiter(second, prefix, 6)
        admitted = [await (a if i % 2 else b).admit("token:1") for i in range(6)]
        refused = [await a.admit("token:1"), await b.admit("token:1")]
        return admitted, refused, await b.admit("token:2")

    admitted, refused, other = with_two_workers(redis_url, body)
    assert admitted == [0.0] * 6
    assert all(0 < wait <= 60 for wait in refused)  # the seventh and eighth, whichever worker they reach
    assert other == 0.0  # another credential counts alone


def test_a_rate_limit_of_zero_is_off(redis_url: str) -> None:
    async def body(first: Redis, second: Redis) -> list[float]:
        limiter = SharedRateLimiter(first, unique_prefix(), 0)
        return [await limiter.admit("token:1") for _ in range(20)]

    assert with_two_workers(redis_url, body) == [0.0] * 20


def test_calls_in_flight_count_across_workers_and_a_released_place_is_free_again(redis_url: str) -> None:
    prefix = unique_prefix()

    async def body(first: Redis, second: Redis) -> list[bool]:
        a, b = SharedConcurrencyLimiter(first, prefix, 2), SharedConcurrencyLimiter(second, prefix, 2)
        one, two = await a.acquire("token:1"), await b.acquire("token:1")
        assert one is not None and two is not None
        over = [await a.acquire("token:1") is None, await b.acquire("token:1") is None]
        other = await b.acquire("token:2") is not None
        await one.release()
        await one.release()  # twice frees one place, not two
        again = await b.acquire("token:1")
        after = [again is not None, await a.acquire("token:1") is None]
        return [*over, other, *after]

    assert with_two_workers(redis_url, body) == [True, True, True, True, True]


def test_the_places_of_a_worker_that_died_free_themselves_and_a_live_worker_keeps_its_own(redis_url: str) -> None:
    prefix = unique_prefix()

    async def body(first: Redis, second: Redis) -> tuple[bool, bool, bool]:
        dying = SharedConcurrencyLimiter(first, prefix, 1, lease_seconds=0.4)
        living = SharedConcurrencyLimiter(second, prefix, 1, lease_seconds=0.4)
        other_key = "token:2"
        assert await dying.acquire("token:1") is not None
        assert await living.acquire(other_key) is not None
        assert dying.leases._renewer is not None
        dying.leases._renewer.cancel()  # the worker is gone: nothing renews its lease any more
        held_at_once = await living.acquire("token:1") is None
        await asyncio.sleep(1.2)  # three leases long: the living worker renewed its own
        freed = await living.acquire("token:1") is not None
        kept = await dying.acquire(other_key) is None
        return held_at_once, freed, kept

    assert with_two_workers(redis_url, body) == (True, True, True)


def test_without_redis_a_request_or_call_is_refused_not_let_through(tmp_path: Path) -> None:
    async def run() -> list[str]:
        redis = connect(f"unix://{tmp_path}/no-redis.sock")
        errors = []
        try:
            for attempt in (
                SharedRateLimiter(redis, "x", 5).admit("token:1"),
                SharedConcurrencyLimiter(redis, "x", 5).acquire("token:1"),
            ):
                with pytest.raises(LimitsUnavailable) as raised:
                    await attempt
                errors.append(str(raised.value))
        finally:
            await redis.aclose()
        return errors

    errors = asyncio.run(run())
    assert "the rate limit cannot be counted: Redis does not answer" in errors[0]
    assert "concurrency limit cannot be counted: Redis does not answer" in errors[1]


# --- the session caps over two workers (SharedSessionLedger) -------------------------------------------------------


async def opened_on(ledger: SharedSessionLedger, key: str, user_id: int = 1, *, busy: bool = False) -> OpenSession:
    entry = await ledger.open(key, user_id)
    assert isinstance(entry, OpenSession), entry
    entry.bind(FakeTransport(f"{key}-{ledger.open_count(key)}"))
    if busy:
        entry.request_started()
    return entry


def test_a_credentials_sessions_count_over_both_workers_and_room_is_made_from_idle_ones_anywhere(
    redis_url: str,
) -> None:
    async def body(first: Redis, second: Redis) -> list[object]:
        a, b = two_ledgers(first, second, per_credential=2, per_user=100)
        seen: list[object] = []
        on_a = await opened_on(a, "bearer:1")  # idle
        on_b = await opened_on(b, "bearer:1", busy=True)
        third = await opened_on(a, "bearer:1", busy=True)  # at the cap: A's own idle session makes room
        seen.append(on_a.closed and not on_b.closed)
        refused = await a.open("bearer:1", 1)  # every session of the credential, on both workers, is busy
        seen.append(refused)
        on_b.request_ended()  # now idle, on the other worker
        fourth = await opened_on(a, "bearer:1")
        seen.append(on_b.closed and not third.closed and not fourth.closed)
        seen.append(isinstance(await b.open("bearer:2", 1), OpenSession))  # another credential counts alone
        return seen

    assert with_two_workers(redis_url, body) == [
        True,
        "this credential has 2 MCP sessions open, all of them busy",
        True,
        True,
    ]


def test_a_users_sessions_count_over_both_workers(redis_url: str) -> None:
    async def body(first: Redis, second: Redis) -> list[object]:
        a, b = two_ledgers(first, second, per_credential=10, per_user=3)
        await opened_on(a, "bearer:1", 7, busy=True)
        await opened_on(b, "bearer:2", 7, busy=True)
        await opened_on(b, "bearer:3", 7, busy=True)
        refused = await a.open("bearer:4", 7)
        closed = await opened_on(b, "bearer:5", 8)  # another user
        closed.release()
        await asyncio.sleep(0.05)  # its lease goes back in a task of its own
        return [refused, isinstance(await a.open("bearer:6", 8), OpenSession)]

    assert with_two_workers(redis_url, body) == ["this credential's user has 3 MCP sessions open", True]


def two_ledgers(first: Redis, second: Redis, *, per_credential: int, per_user: int) -> list[SharedSessionLedger]:
    """Two workers' session ledgers over one Redis, each making room in the other as mcpserver.workers would."""
    prefix = unique_prefix()
    a, b = (
        SharedSessionLedger(redis, prefix, per_credential=per_credential, per_user=per_user, unused_timeout=60)
        for redis in (first, second)
    )
    a.ask_others, b.ask_others = ending_idle_in(b), ending_idle_in(a)
    return [a, b]


def ending_idle_in(other: SharedSessionLedger) -> Callable[[str], Awaitable[bool]]:
    """What mcpserver.workers does over the channel layer: the other worker ends an idle session of the key."""

    async def ask_others(key: str) -> bool:
        ended = other.end_idle(key)
        if ended is not None and ended.lease is not None:
            await ended.lease.release()
        return ended is not None

    return ask_others


def test_a_call_cancelled_while_it_releases_its_place_still_gives_it_back(redis_url: str) -> None:
    async def body(first: Redis, second: Redis) -> bool:
        limiter = SharedConcurrencyLimiter(first, unique_prefix(), 1)
        slot = await limiter.acquire("token:1")
        assert slot is not None
        releasing = asyncio.ensure_future(slot.release())
        await asyncio.sleep(0)
        releasing.cancel()  # as a cancelled call's `finally` is cut short
        await asyncio.sleep(0.2)
        return await limiter.acquire("token:1") is not None

    assert with_two_workers(redis_url, body) is True
