"""Failed authentications, aggregated: the first from an address in a window is recorded at once, the rest as a
count when the window closes, so a flood of bad tokens cannot fill the disk."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MAX_TRACKED_ADDRESSES = 1000
OVERFLOW = "(other addresses)"


@dataclass
class FailureAggregator:
    counts: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, set[str]] = field(default_factory=dict)

    def note(self, address: str, reason: str) -> bool:
        """Count one failure; True if it is the first from this address in the window (record it now)."""
        if address not in self.counts and len(self.counts) >= MAX_TRACKED_ADDRESSES:
            address = OVERFLOW
        first = address not in self.counts
        self.counts[address] += 1
        self.reasons.setdefault(address, set()).add(reason)
        return first and address != OVERFLOW

    def drain(self) -> list[tuple[str, int, list[str]]]:
        """The failures beyond the first per address since the last drain, and a fresh window."""
        summary = [
            (address, count - (0 if address == OVERFLOW else 1), sorted(self.reasons[address]))
            for address, count in self.counts.items()
            if count > 1 or address == OVERFLOW
        ]
        self.counts.clear()
        self.reasons.clear()
        return summary
