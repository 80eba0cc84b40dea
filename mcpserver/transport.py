"""2025-11-25 sessions: a request whose stream could carry nothing but its answer is answered with one JSON body.

The SDK's session transport answers every request POSTed to a session with an SSE stream. For a short tool call
that stream costs more of the server's CPU than the rest of the request: a task group for the response, its writer,
ping and disconnect listeners, memory streams and a chunked body. The spec lets a server answer a request with
`application/json` instead, and every client must accept either. The stream carries more than the answer only if
the server sends more: progress notifications (only for a request that carries a progress token) or requests to the
client (Sandstorm sends one: the elicitation that asks the client's user to approve a call, where a policy rule lets
that user approve). So a request without a progress token gets a JSON answer, and one with a token keeps its stream
and its progress, as does a tools/call of a client that can be asked while the policy has such a rule. The SDK's 2026-07-28 path decides the same way: it commits to SSE only once a handler
emits a notification.

Each session's transport also reports to its credential's place in the session ledger (mcpserver.sessions): the
requests it serves, whether one went beyond the handshake, and its end.

A GET (the session's stream for what the server sends unasked) gets its headers at once, where Daphne would hold
them until the stream's first bytes, and a `Last-Event-ID` on it opens a fresh stream: no event is numbered, so
there is nothing to replay.

The choice is made in `handle_request`, the transport's public entry point: it reads the POST's body (already read
and size-limited by the SDK's body limit, which hands it on as one message), decides, and hands the same messages
to the SDK. The SDK's transport reads its public `is_json_response_enabled` wherever it chooses between the two
answers; here that is a property, true while one chosen POST is handled. It is a context variable set in that
POST's own task, so the session's message router (a task started by the session's opening request, which never
sets it) keeps routing notifications to every other request's stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from mcp.server import streamable_http_manager
from mcp.server.streamable_http import StreamableHTTPServerTransport, check_accept_headers
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from mcpserver.policy_source import POLICY
from mcpserver.sessions import OPENING, OpenSession

logger = logging.getLogger(__name__)
_ANSWER_WITH_JSON: ContextVar[bool] = ContextVar("sandstorm_answer_with_json", default=False)


def only_an_answer_can_follow(body: bytes) -> bool:
    """Whether `body` is one JSON-RPC request, other than `initialize`, without a progress token."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # deep nesting raises RecursionError, not ValueError
        return False
    if not isinstance(message, dict) or "id" not in message or not isinstance(message.get("method"), str):
        return False
    if message["method"] == "initialize":
        return False
    params = message.get("params")
    # The SDK's own reading of the token, so a token it would send progress for always keeps the stream.
    return progress_token_from_params(params if isinstance(params, dict) else None) is None


class SandstormTransport(StreamableHTTPServerTransport):
    """The SDK's session transport, answering with JSON where nothing but the answer can follow."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("mcp_session_id") is not None:
            kwargs["mcp_session_id"] = worker_session_id(kwargs["mcp_session_id"])
        super().__init__(*args, **kwargs)
        # Made by the SDK while it admits the request that opens the session: that request's reservation.
        self.ledger_entry: OpenSession | None = None
        self.client_elicits = False  # the client declared the elicitation capability when it opened the session
        entry = OPENING.get()
        if entry is not None and entry.transport is None and self.mcp_session_id is not None:
            entry.bind(self)
            self.ledger_entry = entry

    async def handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.ledger_entry
        if entry is not None:
            entry.request_started()
        try:
            if scope["method"] == "POST":
                await self._handle_post(scope, receive, send)
            elif scope["method"] == "GET":
                await super().handle_request(without_last_event_id(scope), receive, headers_at_once(send))
            else:
                await super().handle_request(scope, receive, send)
        finally:
            if entry is not None:
                entry.request_ended()

    async def terminate(self) -> None:
        if self.ledger_entry is not None:
            self.ledger_entry.release()  # before any await: the place is free at once
        await super().terminate()

    @property  # the SDK reads it where it chooses JSON or SSE: here per request
    def is_json_response_enabled(self) -> bool:
        return self._json_for_every_request or _ANSWER_WITH_JSON.get()

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        self._json_for_every_request = value

    async def _handle_post(self, scope: Scope, receive: Receive, send: Send) -> None:
        read, body = await read_body(receive)

        async def replay() -> Message:
            return read.popleft() if read else await receive()

        if body is not None and self.ledger_entry is not None:
            self.ledger_entry.note_body(body)
        if body is not None and not self.client_elicits:
            self.client_elicits = declares_elicitation(body)
        if body is None or not self.answers_with_json(scope, body):
            await super().handle_request(scope, replay, send)  # as the SDK would, its 406 included
            return
        chosen = _ANSWER_WITH_JSON.set(True)
        # Nothing else reads the connection while a JSON answer is awaited: a task listens for the client hanging
        # up, which cancels the request's tool call (mcpserver.endpoint.DisconnectWatch), until it is answered.
        listening = asyncio.ensure_future(_read_until_disconnect(receive))
        try:
            await super().handle_request(scope, replay, send)
        finally:
            listening.cancel()
            _ANSWER_WITH_JSON.reset(chosen)

    def answers_with_json(self, scope: Scope, body: bytes) -> bool:
        """Whether this POST gets one JSON body where the SDK would answer with a stream."""
        if self._json_for_every_request or check_accept_headers(Request(scope)) != (True, True):
            return False  # the SDK answers as configured, or refuses what the client accepts
        if self.client_elicits and POLICY.users_may_approve() and b'"tools/call"' in body:
            return False  # the call may ask the client's user (mcpserver.approvals.asking)
        return only_an_answer_can_follow(body)


def without_last_event_id(scope: Scope) -> Scope:
    """A GET's scope without its `Last-Event-ID`: Sandstorm numbers no events and keeps none to replay, so a GET that
    names one opens a fresh stream like any other GET. (The spec's server "MAY use this header to replay"; its GET
    answers with an event stream or 405. Handed the header without an event store, the SDK returns without answering,
    and Daphne keeps the connection open with no answer.)"""
    headers = [(name, value) for name, value in scope["headers"] if name != b"last-event-id"]
    return scope if len(headers) == len(scope["headers"]) else {**scope, "headers": headers}


def headers_at_once(send: Send) -> Send:
    """`send`, with an empty piece of body right after the start of an event stream. Daphne (Twisted) writes a
    response's headers with its first body bytes, so a GET stream's headers would otherwise wait for its first message
    or the first keep-alive comment, 15 s on; the empty piece sends them alone, and the stream carries nothing more."""

    async def sending(message: Message) -> None:
        await send(message)
        if message["type"] == "http.response.start" and is_event_stream(message):
            await send({"type": "http.response.body", "body": b"", "more_body": True})

    return sending


def is_event_stream(start: Message) -> bool:
    content_type = Headers(raw=list(start.get("headers", []))).get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "text/event-stream"


def worker_session_id(session_id: str) -> str:
    """The SDK's new session id, tagged with this worker's number (`w2-…`): Caddy sends every later request of the
    session to the worker that holds it (docs/scaling.md)."""
    return f"w{settings.WORKER}-{session_id}"


def declares_elicitation(body: bytes) -> bool:
    """Whether `body` is an initialize request whose client can be asked questions (elicitation)."""
    if b'"initialize"' not in body:
        return False
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return False
    params = message.get("params") if isinstance(message, dict) and message.get("method") == "initialize" else None
    capabilities = params.get("capabilities") if isinstance(params, dict) else None
    return isinstance(capabilities, dict) and capabilities.get("elicitation") is not None


async def read_body(receive: Receive) -> tuple[deque[Message], bytes | None]:
    """The messages that carry a request's body, to hand on, and the body, or None if the client hung up first."""
    read: deque[Message] = deque()
    body = bytearray()
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return read, None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return read, bytes(body)


async def _read_until_disconnect(receive: Receive) -> None:
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except OSError as error:  # the connection is gone either way; nothing is waiting for this task's result
        logger.debug("stopped listening for a hang-up: %s", error)


def install() -> None:
    """Have the SDK's session manager open every session on SandstormTransport.

    A shim, pinned with the SDK (mcp==2.3.0, requirements.lock) and guarded by tests/test_transport_shim.py:
    StreamableHTTPSessionManager builds a session's transport through the name StreamableHTTPServerTransport in
    its module and takes no argument to choose the class. The upstream change that removes it: a
    `transport_factory` argument on StreamableHTTPSessionManager (and Server.streamable_http_app), called with the
    keyword arguments it now passes to StreamableHTTPServerTransport.
    """
    current = getattr(streamable_http_manager, "StreamableHTTPServerTransport", None)
    if current is not StreamableHTTPServerTransport and current is not SandstormTransport:
        # Without it the session caps would silently stop applying: refuse to start instead.
        raise RuntimeError(
            f"mcp.server.streamable_http_manager no longer builds its transport as expected: {current!r}"
        )
    streamable_http_manager.StreamableHTTPServerTransport = SandstormTransport  # type: ignore[misc]  # the shim above
