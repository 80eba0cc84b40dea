"""The /mcp endpoint: bearer authentication and rate limiting in front of the SDK's session manager."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from django.db import DatabaseError
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from audit.failures import FailureAggregator
from audit.log import Actor, acall_denied, aevent
from mcpserver.call import principal_actor
from mcpserver.inflight import IN_FLIGHT
from mcpserver.instance import INSTANCE_ID
from mcpserver.limits import RateLimiter
from mcpserver.runner import SessionManagerRunner
from mcpserver.sessions import OPENING, SessionLedger
from oauth.credentials import InsufficientScope, Principal
from oauth.models import SCOPE_ALL, SCOPE_READ

logger = logging.getLogger(__name__)

Authenticator = Callable[..., Awaitable[Principal | None]]
PRINCIPAL_KEY = "sandstorm.principal"
DENIED_RECORDS_PER_MINUTE = 10
SESSION_REFUSED = -32000  # in JSON-RPC's range for server errors


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


async def send_json(send: Send, status: int, body: dict[str, object], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": base + headers})
    await send({"type": "http.response.body", "body": payload})


class BearerAuthMiddleware:
    """Resolves `Authorization: Bearer` to a principal or answers 401; applies the per-credential rate limit.

    The principal goes into the ASGI scope, and the SDK's AuthenticatedUser into scope["user"]: the SDK binds a
    session id to the credential that opened it only when that user is set. Tokens in the query string are never
    looked at.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticate: Authenticator,
        rate_limiter: RateLimiter,
        resource_metadata_url: str,
        failures: FailureAggregator,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.rate_limiter = rate_limiter
        self.resource_metadata_url = resource_metadata_url
        self.failures = failures
        # Denied calls over the rate limit are recorded, but at most this many a minute per credential.
        self.denial_records = RateLimiter(DENIED_RECORDS_PER_MINUTE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, raw = headers.get("authorization", "").partition(" ")
        raw = raw.strip()
        principal = None
        if scheme.lower() == "bearer" and raw:
            try:
                principal = await self.authenticate(
                    raw, client_address=client_address(scope), user_agent=headers.get("user-agent", "")[:300]
                )
            except InsufficientScope:
                await self.record_failure(client_address(scope), "insufficient_scope")
                await self.insufficient_scope(send)
                return
        if principal is None:
            await self.record_failure(client_address(scope), "invalid_token" if raw else "missing_token")
            await self.unauthorized(send, token_given=bool(raw))
            return
        wait = self.rate_limiter.check(principal.key)
        if wait:
            if not self.denial_records.check(principal.key):
                await record_rate_limited_call(scope, receive, principal)
            await self.too_many(send, wait)
            return
        scope = dict(scope)
        scope[PRINCIPAL_KEY] = principal
        scope["user"] = AuthenticatedUser(
            # `token` holds the credential's id, never its secret: the SDK keeps this object for the session's life.
            AccessToken(token=principal.key, client_id=principal.key, scopes=sorted(principal.scopes), subject=str(principal.user_id))
        )
        await self.app(scope, receive, send)

    async def record_failure(self, address: str, reason: str) -> None:
        if self.failures.note(address, reason):
            try:
                await aevent("auth.failed", Actor(client_address=address), instance_id=INSTANCE_ID, reason=reason)
            except DatabaseError:
                logger.exception("could not record a failed authentication")

    async def unauthorized(self, send: Send, *, token_given: bool) -> None:
        challenge = f'Bearer resource_metadata="{self.resource_metadata_url}"'
        body: dict[str, object] = {"error": "unauthorized", "error_description": "A bearer token is required."}
        if token_given:
            challenge = f'Bearer error="invalid_token", error_description="The token is unknown, revoked or expired", resource_metadata="{self.resource_metadata_url}"'
            body = {"error": "invalid_token", "error_description": "The token is unknown, revoked or expired."}
        await send_json(send, 401, body, [(b"www-authenticate", challenge.encode())])

    async def insufficient_scope(self, send: Send) -> None:
        challenge = f'Bearer error="insufficient_scope", scope="{SCOPE_ALL}", resource_metadata="{self.resource_metadata_url}"'
        body = {"error": "insufficient_scope", "error_description": f"The token carries neither {SCOPE_ALL} nor {SCOPE_READ}."}
        await send_json(send, 403, body, [(b"www-authenticate", challenge.encode())])

    async def too_many(self, send: Send, wait: float) -> None:
        retry = RateLimiter.retry_after_header(wait)
        body = {"error": "rate_limited", "error_description": f"Too many requests for this credential; retry in {retry}s."}
        await send_json(send, 429, body, [(b"retry-after", retry.encode())])


async def read_body(receive: Receive, limit: int) -> bytes:
    body = b""
    while len(body) <= limit:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    return body


async def record_rate_limited_call(scope: Scope, receive: Receive, principal: Principal) -> None:
    """If the refused request was a tools/call, record it as denied (reading at most 1 MiB of its body)."""
    try:
        message = json.loads(await read_body(receive, 1 << 20))
    except (ValueError, RecursionError):  # deep nesting raises RecursionError, not ValueError
        return
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    arguments = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
    headers = Headers(scope=scope)
    actor = principal_actor(principal, headers.get("mcp-session-id", ""), headers.get("mcp-protocol-version", ""))
    try:
        await acall_denied(actor, str(params.get("name", ""))[:64], arguments, "Error: rate limit exceeded", INSTANCE_ID)
    except DatabaseError:
        logger.exception("could not record a rate-limited call")


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
        entry = self.sessions.admit(principal.key, principal.user_id)
        if entry is None:
            await self.too_many_sessions(send, principal)
            return
        opening = OPENING.set(entry)
        try:
            await self.runner.manager.handle_request(scope, receive, send)
        finally:
            OPENING.reset(opening)
            if entry.transport is None:  # no session was made (a 2026-07-28 request, a refusal): free the place
                entry.release()

    async def too_many_sessions(self, send: Send, principal: Principal) -> None:
        if self.sessions.open_count(principal.key) >= self.sessions.per_credential:
            why = f"this credential has {self.sessions.per_credential} MCP sessions open, all of them busy"
        else:
            why = f"this credential's user has {self.sessions.per_user} MCP sessions open"
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

    def __init__(self, session_id: str, receive: Receive, send: Send) -> None:
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
            if request_ids:
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
