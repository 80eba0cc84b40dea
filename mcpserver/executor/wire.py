"""The executor socket's wire format: length-prefixed JSON frames, and how results travel in them.

A connection carries one call at a time, and may be reused for the next. The server sends a request frame, `{"op": name, "args": {...}}`; the executor
answers with zero or more event frames (`{"output": text}` while a command runs, `{"spawned": {...}}` when it
started one) and then exactly one final frame: `{"ok": value}`, `{"fail": message}` (an expected tool failure,
shown to the agent) or `{"error": message}` (a fault in the executor). Closing the connection cancels the call
in flight; the server sends nothing else while a call runs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import asdict
from typing import Any

from mcpserver.executor.interface import BackgroundStart, ExecResult

HEADER = struct.Struct(">I")
# Results are already capped (tool output budgets, the result cap); this only bounds a corrupt or hostile length.
MAX_FRAME = 512 * 1024 * 1024

_RESULT_TYPES: dict[str, type[Any]] = {"ExecResult": ExecResult, "BackgroundStart": BackgroundStart}


class FrameError(Exception):
    """A frame that is not valid: too large, not JSON, not an object."""


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, ValueError) as error:
        raise FrameError(f"frame is not JSON: {error}") from error
    if not isinstance(message, dict):
        raise FrameError("frame is not a JSON object")
    return message


async def read_frame(reader: asyncio.StreamReader, early: bytes = b"") -> dict[str, Any] | None:
    """The next frame, or None when the peer closed the connection between frames. `early`: its first bytes,
    if they were already read."""
    try:
        header = early + await reader.readexactly(HEADER.size - len(early))
    except asyncio.IncompleteReadError as error:
        if error.partial or early:
            raise FrameError("connection closed inside a frame header") from error
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes is over the {MAX_FRAME}-byte limit")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as error:
        raise FrameError("connection closed inside a frame") from error
    return decode(body)


def recv_frame(connection: socket.socket) -> dict[str, Any] | None:
    """`read_frame` for a blocking socket: the next frame, or None at a clean end of the connection."""

    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = connection.recv(count - len(data))
            if not chunk:
                break
            data += chunk
        return data

    header = exactly(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise FrameError("connection closed inside a frame header")
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes is over the {MAX_FRAME}-byte limit")
    body = exactly(length)
    if len(body) < length:
        raise FrameError("connection closed inside a frame")
    return decode(body)


def to_wire(value: object) -> object:
    """A tool result as JSON: dataclasses carry their type name so the other side rebuilds them."""
    if isinstance(value, (ExecResult, BackgroundStart)):
        return {"__type__": type(value).__name__, **asdict(value)}
    return value


def from_wire(value: object) -> object:
    if isinstance(value, dict) and value.get("__type__") in _RESULT_TYPES:
        fields = {key: item for key, item in value.items() if key != "__type__"}
        return _RESULT_TYPES[value["__type__"]](**fields)
    return value
