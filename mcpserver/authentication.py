"""Bearer authentication and the per-credential rate limit at /mcp, in front of the endpoint (mcpserver.endpoint)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from django.db import DatabaseError
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from audit.failures import FailureAggregator
from audit.log import Actor, aevent
from mcpserver.call import PRINCIPAL_KEY, audit_actor
from mcpserver.dispatch import call_parts, record_denied
from mcpserver.limits import LimitsUnavailable, RateLimiter, RequestLimit
from mcpserver.process import INSTANCE_ID
from mcpserver.responses import send_json
from mcpserver.scopes import SCOPE_TO_USE, bearer_challenge
from oauth.credentials import CredentialSuspended, InsufficientScope, Principal
from oauth.models import SCOPE_ALL, SCOPE_READ

logger = logging.getLogger(__name__)

Authenticator = Callable[..., Awaitable[Principal | None]]
DENIED_RECORDS_PER_MINUTE = 10
CREDENTIAL_SUSPENDED = -32001  # in JSON-RPC's range for server errors (mcpserver.endpoint's session refusal: -32000)
SUSPENDED_WORDS = (
    "This credential is suspended by an administrator of this Sandstorm server: its requests are refused until an "
    "administrator resumes it."
)


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


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
        rate_limiter: RequestLimit,
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
            except CredentialSuspended as suspended:
                await self.record_failure(client_address(scope), f"suspended {suspended.kind} credential")
                await self.suspended(send)
                return
        if principal is None:
            await self.record_failure(client_address(scope), "invalid_token" if raw else "missing_token")
            await self.unauthorized(send, token_given=bool(raw))
            return
        try:
            wait = await self.rate_limiter.admit(principal.key)
        except LimitsUnavailable as error:
            logger.error("refusing a request: %s", error)
            await send_json(
                send,
                503,
                {"error": "temporarily_unavailable", "error_description": "The server cannot count its rate limit."},
                [(b"retry-after", b"5")],
            )
            return
        if wait:
            if not self.denial_records.check(principal.key):
                await record_rate_limited_call(scope, receive, principal)
            await self.too_many(send, wait)
            return
        scope = dict(scope)
        scope[PRINCIPAL_KEY] = principal
        scope["user"] = AuthenticatedUser(
            # `token` holds the credential's id, never its secret: the SDK keeps this object for the session's life.
            AccessToken(
                token=principal.key,
                client_id=principal.key,
                scopes=sorted(principal.scopes),
                subject=str(principal.user_id),
            )
        )
        await self.app(scope, receive, send)

    async def record_failure(self, address: str, reason: str) -> None:
        if self.failures.note(address, reason):
            try:
                await aevent("auth.failed", Actor(client_address=address), instance_id=INSTANCE_ID, reason=reason)
            except DatabaseError:
                logger.exception("could not record a failed authentication")

    async def unauthorized(self, send: Send, *, token_given: bool) -> None:
        """401, naming the scope to ask for (mcpserver.scopes): an OAuth client's first authorization requests it."""
        challenge = bearer_challenge(self.resource_metadata_url, scope=SCOPE_TO_USE)
        body: dict[str, object] = {"error": "unauthorized", "error_description": "A bearer token is required."}
        if token_given:
            challenge = bearer_challenge(
                self.resource_metadata_url,
                error="invalid_token",
                scope=SCOPE_TO_USE,
                error_description="The token is unknown, revoked or expired",
            )
            body = {"error": "invalid_token", "error_description": "The token is unknown, revoked or expired."}
        await send_json(send, 401, body, [(b"www-authenticate", challenge)])

    async def insufficient_scope(self, send: Send) -> None:
        challenge = bearer_challenge(self.resource_metadata_url, error="insufficient_scope", scope=SCOPE_TO_USE)
        body = {
            "error": "insufficient_scope",
            "error_description": f"The token carries neither {SCOPE_ALL} nor {SCOPE_READ}.",
        }
        await send_json(send, 403, body, [(b"www-authenticate", challenge)])

    async def suspended(self, send: Send) -> None:
        """403, not 401: the token is genuine, and a 401 would send an OAuth client to renew it (or its user to sign
        in again) in a loop. The body is a JSON-RPC error, which the MCP SDK's client hands its caller as it is."""
        challenge = (
            f'Bearer error="invalid_token", error_description="The credential is suspended by an administrator", '
            f'resource_metadata="{self.resource_metadata_url}"'
        )
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": CREDENTIAL_SUSPENDED, "message": SUSPENDED_WORDS}}
        await send_json(send, 403, body, [(b"www-authenticate", challenge.encode())])

    async def too_many(self, send: Send, wait: float) -> None:
        retry = RateLimiter.retry_after_header(wait)
        body = {
            "error": "rate_limited",
            "error_description": f"Too many requests for this credential; retry in {retry}s.",
        }
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
    tool, arguments = call_parts(message.get("params"))
    headers = Headers(scope=scope)
    actor = audit_actor(principal, headers.get("mcp-session-id", ""), headers.get("mcp-protocol-version", ""))
    await record_denied(actor, tool, arguments, "Error: rate limit exceeded")
