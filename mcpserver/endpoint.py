"""The /mcp endpoint behind authentication: hands each request to the SDK's session manager, admitting new sessions
through the session ledger and cancelling the tool calls of a POST whose client hung up."""

from __future__ import annotations

import json
import logging

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from mcpserver.call import PRINCIPAL_KEY
from mcpserver.inflight import IN_FLIGHT
from mcpserver.lifespan import SessionManagerRunner
from mcpserver.limits import LimitsUnavailable
from mcpserver.responses import send_json
from mcpserver.sessions import OPENING, SessionLedger
from oauth.credentials import Principal

logger = logging.getLogger(__name__)
SESSION_REFUSED = -32000  # in JSON-RPC's range for server errors


class McpEndpoint:
    """Hands each request to the SDK's session manager, starting it on first use if the reactor hook did not.

    A request without a session id may open one: it first gets a place in the session ledger (its credential's
    and user's caps), or a 429.
    """

    def __init__(self, runner: SessionManagerRunner, sessions: SessionLedger) -> None:
        self.runner = runner
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.runner.running:
            await self.runner.ensure_started()
        headers = Headers(scope=scope)
        session_id = headers.get("mcp-session-id")
        if not session_id and opens_a_session(headers.get("mcp-protocol-version")):
            await self.may_open_a_session(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self.runner.manager.handle_request(scope, receive, send)
            return
        watch = DisconnectWatch(session_id, receive, send)
        await self.runner.manager.handle_request(scope, watch.receive, watch.send)

    async def may_open_a_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal: Principal = scope[PRINCIPAL_KEY]
        try:
            entry = await self.sessions.open(principal.key, principal.user_id)
        except LimitsUnavailable as error:
            logger.error("refused a new MCP session: %s", error)
            body = {"error": "temporarily_unavailable", "error_description": "The server cannot count its sessions."}
            await send_json(send, 503, body, [(b"retry-after", b"5")])
            return
        if isinstance(entry, str):
            await self.too_many_sessions(send, principal, entry)
            return
        entry.principal = principal  # for the console's page of open sessions
        opening = OPENING.set(entry)
        try:
            await self.runner.manager.handle_request(scope, receive, send)
        finally:
            OPENING.reset(opening)
            if entry.transport is None:  # no session was made (a 2026-07-28 request, a refusal): free the place
                entry.release()

    async def too_many_sessions(self, send: Send, principal: Principal, why: str) -> None:
        logger.warning("refused a new MCP session of %s: %s", principal.key, why)
        message = f"Too many open sessions: {why}. End sessions no longer used (HTTP DELETE) or wait for them to close."
        body: dict[str, object] = {"jsonrpc": "2.0", "id": None, "error": {"code": SESSION_REFUSED, "message": message}}
        retry = str(max(1, round(self.sessions.unused_timeout)))
        await send_json(send, 429, body, [(b"retry-after", retry.encode())])


def opens_a_session(protocol_version: str | None) -> bool:
    """Whether a request without a session id is the SDK's to open a session with (its own routing: a version
    header outside the handshake's versions makes it a self-contained 2026-07-28 request)."""
    return protocol_version is None or protocol_version in HANDSHAKE_PROTOCOL_VERSIONS


class DisconnectWatch:
    """Cancels the tool calls of a session's POST whose client hung up before the answer was sent.

    In a stateful session the SDK keeps a request running after its POST stream drops (a client could resume it
    from an event store; we keep none), so without this a command would run on, unseen, until its timeout.
    """

    def __init__(self, session_id: str | None, receive: Receive, send: Send) -> None:
        self.session_id = session_id
        self._receive = receive
        self._send = send
        self._body = bytearray()
        self._answered = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._body += message.get("body", b"")
        elif message["type"] == "http.disconnect" and not self._answered:
            request_ids = tool_call_ids(bytes(self._body))
            if request_ids and self.session_id is not None:  # calls without a session have no id to find them by
                IN_FLIGHT.cancel_request(self.session_id, request_ids)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self._answered = True
        await self._send(message)


def tool_call_ids(body: bytes) -> set[str]:
    """The ids of the tools/call requests in a JSON-RPC body (one message or a batch)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # deep nesting raises RecursionError, not ValueError
        return set()
    messages = parsed if isinstance(parsed, list) else [parsed]
    return {
        str(message["id"])
        for message in messages
        if isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message
    }
