"""The cells of the bench's Markdown table that every section's rows share: durations and whether targets were met."""

from __future__ import annotations

from typing import Any


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def mark(met: bool | None) -> str:
    return "–" if met is None else "met" if met else "**NOT MET**"


def met(found: list[dict[str, Any]], key: str) -> str:
    for target in found:
        if target["key"] == key:
            return mark(target["met"])
    return "–"


def combined(found: list[dict[str, Any]], *keys: str) -> str:
    marks = [target["met"] for target in found if target["key"] in keys]
    return mark(all(marks) if marks and None not in marks else None)
