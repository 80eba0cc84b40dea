"""bench/toolkit_edit.py against the live server: it measures file_edit and its floor, and reports the ratios."""

from __future__ import annotations

import pytest

from bench import toolkit_edit
from bench.sections import Sizes
from tests.live import LiveServer

pytestmark = [pytest.mark.live, pytest.mark.anyio]


async def test_the_edit_bench_times_both_and_measures_the_executors_memory(live_server: LiveServer) -> None:
    results = await toolkit_edit.measure(live_server, Sizes(big_repeats=1))
    assert results["file_bytes"] == 10_000_000
    for name in ("file_edit", "floor"):
        assert results[name]["n"] >= 2 and 0 < results[name]["median_ms"] < 60_000, name
    assert results["time_ratio"] > 0 and results["time_target"] == 2.0 and results["memory_target"] == 3.0
    assert results["memory_ratio"] is not None and results["memory_ratio"] > 0
    assert not (live_server.workspace / toolkit_edit.FILE_NAME).exists()
