"""The live view's feed (mcpserver/live.py): a burst of calls reaches the console's pages as a few coalesced batches
that, together, tell every start, every piece of output and every end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.layers import get_channel_layer

from mcpserver.live import FLUSH_SECONDS, GROUP, LiveCall, LiveFeed

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def received(layer: Any, channel: str, until: float) -> list[dict[str, Any]]:
    messages = []
    while time.monotonic() < until:
        try:
            messages.append(await asyncio.wait_for(layer.receive(channel), max(0.01, until - time.monotonic())))
        except TimeoutError:
            break
    return messages


async def test_fifty_calls_a_second_arrive_as_a_few_batches_that_lose_nothing() -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    feed = LiveFeed()
    began = time.monotonic()
    ids = [f"{n:032x}" for n in range(100)]
    for number, call_id in enumerate(ids):  # 100 calls over 2 seconds, each with output, each ended
        feed.started(LiveCall(call_id, "terminal_exec", f"echo {number}", "agent", "laptop", "bearer:1", "::1"))
        feed.output(call_id, f"line {number}\n")
        feed.ended(call_id, "ok")
        await asyncio.sleep(0.02)
    messages = await received(layer, channel, time.monotonic() + 2 * FLUSH_SECONDS + 0.5)
    elapsed = time.monotonic() - began
    await layer.group_discard(GROUP, channel)
    assert 1 < len(messages) <= elapsed / FLUSH_SECONDS + 2  # one batch per interval at most, not one per change
    ended = {call_id: outcome for message in messages for call_id, outcome in message["ended"].items()}
    assert ended == dict.fromkeys(ids, "ok") and feed.running() == []


async def test_a_flood_of_output_keeps_its_newest_part_in_each_batch() -> None:
    feed = LiveFeed()
    call_id = "f" * 32
    feed.started(LiveCall(call_id, "terminal_exec", "yes", "agent", "laptop", "bearer:1", "::1"))
    for number in range(2000):
        feed.output(call_id, f"{number:08d}" * 8 + "\n")
    [running] = feed.running()
    assert running["output"].endswith(f"{1999:08d}" * 8 + "\n") and len(running["output"]) <= 16 * 1024
