"""Step-up at /mcp: an OAuth credential whose scope does not allow the tool call it sends gets `403` with
`WWW-Authenticate: Bearer error="insufficient_scope", scope="mcp", …` before the SDK sees the request, so that its
client can ask its user for the larger scope and send the call again (the MCP authorization spec's scope challenge,
RFC 6750 §3.1, SEP-835). The consent page then shows the re-authorization as an upgrade (oauth.views.consent).

Here, not in dispatch: dispatch runs inside the SDK's tools/call handling, once the HTTP answer (a 200, or a
session's event stream) may have begun. The decision is dispatch's own (mcpserver.scopes.scope_refusal), applied to
the body the JSON gate has read (mcpserver.bodies.BODY_KEY), and the refusal is audited as dispatch audits it: a
started and a finished record, outcome denied, the same reason.

Left to dispatch, answered as before: admin-issued bearer tokens (no client can widen them: a tool error says what is
refused), and calls while the server stops or while the audit log is full (dispatch's answers come first there).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic_core
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mcpserver.bodies import BODY_KEY
from mcpserver.call import PRINCIPAL_KEY, audit_actor
from mcpserver.dispatch import call_parts, record_denied
from mcpserver.registry import TOOLS, ToolSpec
from mcpserver.responses import send_json
from mcpserver.scopes import SCOPE_TO_WRITE, bearer_challenge, may_step_up, scope_refusal
from mcpserver.services import Services
from oauth.credentials import Principal

INSUFFICIENT_SCOPE = -32003  # in JSON-RPC's range for server errors (-32000 and -32001 are taken at /mcp)
STEP_UP_WORDS = (
    "{reason}. Its app can ask for full access (scope {scope}) by authorizing again, which a staff user of this "
    "server approves; until then it keeps its read-only access."
)


@dataclass(frozen=True)
class RefusedCall:
    principal: Principal
    request_id: Any
    tool: str
    arguments: dict[str, Any]
    reason: str


class StepUpGate:
    """Answers an OAuth credential's tools/call that its scope refuses with 403 `insufficient_scope`; passes
    everything else on."""

    def __init__(self, app: ASGIApp, *, services: Services, resource_metadata_url: str) -> None:
        self.app = app
        self.services = services
        self.resource_metadata_url = resource_metadata_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = await self.refused_call(scope)
        if refused is None:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)  # the session and version as dispatch records them: the request's own
        actor = audit_actor(
            refused.principal, headers.get("mcp-session-id", ""), headers.get("mcp-protocol-version", "")
        )
        await record_denied(actor, refused.tool, refused.arguments, refused.reason)
        await self.challenge(send, refused)

    async def refused_call(self, scope: Scope) -> RefusedCall | None:
        """The tools/call in this request's body that its OAuth credential's scope refuses, if it is one."""
        principal, body = scope.get(PRINCIPAL_KEY), scope.get(BODY_KEY)
        if not isinstance(principal, Principal) or not principal.read_only or not may_step_up(principal):
            return None
        if body is None:  # not a POST, or a body over the limit (the SDK's 413)
            return None
        message = pydantic_core.from_json(body, allow_inf_nan=False)  # strict JSON: the gate in front has parsed it
        if not isinstance(message, dict) or message.get("method") != "tools/call" or "id" not in message:
            return None  # a batch, a notification or another method: nothing a scope refuses
        name, given = call_parts(message.get("params"))
        spec = TOOLS.get(name)
        if spec is None:
            return None  # the SDK's "Unknown tool", recorded as denied by the tool server
        arguments = as_called(spec, given)
        reason = scope_refusal(spec, principal, arguments)
        if reason is None or self.services.stop.stopping or await self.audit_log_full():
            return None
        return RefusedCall(principal, message["id"], spec.name, arguments, reason)

    async def audit_log_full(self) -> bool:
        state = await self.services.audit_budget.state()
        return state is not None and state.full

    async def challenge(self, send: Send, refused: RefusedCall) -> None:
        """403 with the challenge the SDK clients act on, and a JSON-RPC error for the request, which a client that
        does not step up hands its caller as it is."""
        challenge = bearer_challenge(
            self.resource_metadata_url,
            error="insufficient_scope",
            scope=SCOPE_TO_WRITE,
            error_description=refused.reason.removeprefix("Error: "),  # printable ASCII, no quotes: tool names
        )
        message = STEP_UP_WORDS.format(reason=refused.reason, scope=SCOPE_TO_WRITE)
        body = {"jsonrpc": "2.0", "id": refused.request_id, "error": {"code": INSUFFICIENT_SCOPE, "message": message}}
        await send_json(send, 403, body, [(b"www-authenticate", challenge)])


def as_called(spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as the SDK passes them to the tool, and dispatch records them: each of its parameters in
    order, those not given at their defaults, nothing else; not validated (the call does not run)."""
    parameters = list(inspect.signature(spec.fn).parameters.values())[1:]  # the first is the ToolCall
    return {
        p.name: arguments[p.name] if p.name in arguments else p.default
        for p in parameters
        if p.name in arguments or p.default is not inspect.Parameter.empty
    }
