"""A recording (audit/recordings.py) as an asciicast v2 file, which `asciinema play` and asciinema-player take.

Output read from pipes ends its lines with "\n" alone, which a terminal would show as a staircase: those events get
"\r\n". Stderr is output to a terminal too ("o"), typed input is "i", and our notes are dimmed lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from audit.recordings import Event

WIDTH, HEIGHT = 160, 40
DIM, PLAIN = "\x1b[2m", "\x1b[0m"


def cast_lines(header: dict[str, Any], events: list[Event], title: str) -> Iterator[str]:
    pty = bool(header.get("pty"))
    started = header.get("started")
    first: dict[str, Any] = {"version": 2, "width": WIDTH, "height": HEIGHT, "title": title}
    if isinstance(started, (int, float)):
        first["timestamp"] = int(started)
    yield json.dumps(first) + "\n"
    for at, code, text in events:
        if code == "i":
            yield json.dumps([at, "i", text]) + "\n"
            continue
        if not pty:
            text = text.replace("\r\n", "\n").replace("\n", "\r\n")
        if code == "m":
            text = f"\r\n{DIM}{text}{PLAIN}\r\n"
        yield json.dumps([at, "o", text]) + "\n"
