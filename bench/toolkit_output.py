"""terminal_output's wait: how soon after a background command writes a line the waiting call answers with it.

A background command prints the time (bash's $EPOCHREALTIME, no process started for it) every LINE_INTERVAL
seconds; each terminal_output call waits from the previous next_offset, and the latency is when its answer arrived
less the time in the first line it brought. The same machine's clock on both sides. The floor beside it, in the same
run, is a /health round trip: what any answer costs.
"""

from __future__ import annotations

import time
from typing import Any

from bench.client import HttpError, McpSession
from bench.quick_look import quick_look
from bench.sections import Sizes, connection
from bench.stats import summary
from tests.live import LiveServer

LINE_INTERVAL = 0.2
TARGET_MS = 50.0
WAIT_MS = 5_000


async def measure(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    lines = 40 if sizes.big_repeats > 3 else 15
    http, session = connection(server), McpSession(connection(server), server.token)
    try:
        await session.start()
        command = f'for i in $(seq {lines}); do sleep {LINE_INTERVAL}; printf "%s\\n" "$EPOCHREALTIME"; done'
        started = await session.call("terminal_exec_background", {"command": command})
        job = int(started["content"][0]["text"].split()[1])
        latencies, floors = await _follow(session, http, job, lines)
    finally:
        await session.close()
        await http.close()
    wake, floor = summary(latencies), summary(floors)
    return {
        "lines": lines,
        "wake": wake,
        "floor": floor,
        "target_ms": TARGET_MS,
        "met": wake["median_ms"] is not None and wake["median_ms"] <= TARGET_MS,
    }


async def _follow(session: McpSession, http: Any, job: int, lines: int) -> tuple[list[float], list[float]]:
    latencies: list[float] = []
    floors: list[float] = []
    offset, seen = 0, 0
    while seen < lines:
        result = await session.call("terminal_output", {"id": job, "offset": offset, "wait_ms": WAIT_MS})
        arrived = time.time()
        structured = result["structuredContent"]
        new = [line for line in result["content"][0]["text"].split("\n\n", 1)[-1].splitlines() if line]
        if structured["next_offset"] > offset and new:
            latencies.append(arrived - float(new[0]))
            seen += len(new)
        elif structured["state"] != "running":
            raise AssertionError(f"the command ended after {seen} of {lines} lines")
        offset = structured["next_offset"]
        begun = time.perf_counter()  # between lines, while the command sleeps: one /health round trip
        response = await http.request("GET", "/health", {})
        if response.status != 200:
            raise HttpError(f"http_{response.status}", "/health")
        floors.append(time.perf_counter() - begun)
    return latencies[1:], floors  # the first line's wait began with the command's start


if __name__ == "__main__":  # a quick look by hand: python -m bench.toolkit_output
    quick_look(measure)
