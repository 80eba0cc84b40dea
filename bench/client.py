"""A lean HTTP/1.1 keep-alive client and a raw JSON-RPC MCP session on top of it.

Deliberately minimal (asyncio streams, no HTTP library): the point is to time the server, so the client's own work
per call must stay a small fraction of it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "2025-11-25"


class HttpError(Exception):
    """An answer the benchmark did not expect (its kind is counted in the concurrency section)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Connection:
    """One keep-alive TCP connection; requests on it are sequential."""

    host: str
    port: int
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.reader = self.writer = None

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Response:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return await self._read_response()

    async def _read_response(self) -> Response:
        assert self.reader is not None
        status_line = await self.reader.readline()
        if not status_line:
            await self.close()
            raise HttpError("connection_closed")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "set-cookie":  # the only header that comes several times here; kept one a line
                headers["set-cookie-all"] = (headers.get("set-cookie-all", "") + "\n" + value).strip()
            headers[name] = value
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked()
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Response(status, headers, body)

    async def _read_chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                while await self.reader.readline() not in (b"\r\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)


def response_message(response: Response) -> dict[str, Any]:
    """The JSON-RPC response: the whole body (application/json), or in an SSE stream the last `data:` line that
    holds one."""
    body = response.body
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = json.loads(body)
        return message
    for line in reversed(body.split(b"\n")):
        if line.startswith(b"data:"):
            message = json.loads(line[5:])
            if "result" in message or "error" in message:
                return message
    raise HttpError("no_response_in_stream", body[:200].decode(errors="replace"))


@dataclass
class McpSession:
    """One MCP session (2025-11-25 handshake, Mcp-Session-Id) over one keep-alive connection."""

    connection: Connection
    token: str
    session_id: str = ""
    next_id: int = 1
    base_headers: dict[str, str] = field(default_factory=dict)

    async def start(self) -> None:
        self.base_headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        }
        response = await self._post({"jsonrpc": "2.0", "id": self._id(), "method": "initialize", "params": params})
        self.session_id = response.headers.get("mcp-session-id", "")
        if response.status != 200 or not self.session_id:
            raise HttpError(f"http_{response.status}", "initialize")
        self.base_headers["Mcp-Session-Id"] = self.session_id
        self.base_headers["Mcp-Protocol-Version"] = PROTOCOL_VERSION
        notified = await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if notified.status != 202:
            raise HttpError(f"http_{notified.status}", "notifications/initialized")

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    async def _post(self, message: dict[str, Any]) -> Response:
        return await self.connection.request("POST", "/mcp", self.base_headers, json.dumps(message).encode())

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool; the result object. Raises HttpError for anything but a successful, non-error result."""
        message = {
            "jsonrpc": "2.0",
            "id": self._id(),
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        response = await self._post(message)
        if response.status != 200:
            raise HttpError(f"http_{response.status}", response.body[:200].decode(errors="replace"))
        answer = response_message(response)
        if "error" in answer:
            raise HttpError("jsonrpc_error", str(answer["error"])[:200])
        result: dict[str, Any] = answer["result"]
        if result.get("isError"):
            text = "".join(block.get("text", "") for block in result.get("content", []))
            raise HttpError("tool_error", text[:200])
        return result

    async def close(self) -> None:
        if self.session_id:
            try:
                await self.connection.request("DELETE", "/mcp", self.base_headers)
            except (HttpError, OSError):
                pass
        await self.connection.close()


def result_text(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result.get("content", []))
