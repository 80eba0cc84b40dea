"""Summaries of timings, and the machine they were taken on."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any


def summary(seconds: list[float]) -> dict[str, Any]:
    """Median, p95, mean and min of a list of durations, in milliseconds."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0, "median_ms": None, "p95_ms": None, "mean_ms": None, "min_ms": None}
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(p95 * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
        "min_ms": round(ordered[0] * 1000, 3),
    }


def ratio(value: float | None, floor: float | None) -> float | None:
    if value is None or not floor:
        return None
    return round(value / floor, 2)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_total_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_mb": memory_total_mb(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "kernel": platform.release(),
        "system": platform.system(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


# --- the server's memory (Linux) -----------------------------------------------------------------------------------


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak(pid: int) -> int | None:
    """Reset the process's peak RSS (VmHWM) to its current RSS; that RSS in KiB, or None where Linux can't."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kb(pid, "VmRSS")


def peak_kb(pid: int) -> int | None:
    return _status_kb(pid, "VmHWM")
