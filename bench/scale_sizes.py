"""How much work section 8 (bench/scale.py) does, and where its one-server figures run."""

from __future__ import annotations

from dataclasses import dataclass

# Where figures 2 to 4 run: a worker's own memory and event loop are what they measure.
ONE_SERVER = "one server, SQLite (the bench's default), Daphne on TCP without Caddy"


@dataclass(frozen=True)
class ScaleSizes:
    """How much work the section does besides the load it shares with section 5 (sections.Sizes)."""

    rounds: int = 2  # loads on each stack, in turns (1, 2, 2, 1), after a warm-up load on each
    warmup_calls: int = 2  # calls per client in the warm-up load
    credentials: int = 100
    sessions_per_credential: int = 10
    connects: int = 20
    sleepers: int = 100
    sleep_s: int = 10
    reads_alone: int = 100
    reads_compared: int = 300  # figure 4: file_read calls on each server

    @classmethod
    def quick(cls) -> ScaleSizes:
        return cls(credentials=10, connects=5, sleepers=10, sleep_s=2, reads_alone=20, reads_compared=40)
