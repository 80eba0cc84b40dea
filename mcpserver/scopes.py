"""What a credential's scope allows, decided in one place, and the Bearer challenges that name the scope /mcp needs.

`scope_refusal` is the one decision: dispatch applies it to every call, and the step-up gate (mcpserver.step_up)
applies the same function to an OAuth credential's tools/call before the SDK sees it, so the two cannot disagree.

The challenges follow RFC 6750 §3 and the MCP authorization spec (2025-11-25, and 2026-07-28 with SEP-2350): the 401
names the scope a client should ask for to use this server (`mcp`: the approver may still narrow it to `mcp:read` on
the consent page), and a 403 `insufficient_scope` names the scope the refused request needs (`mcp`), which an OAuth
client adds to what it holds and asks its user's approval for (step-up, SEP-835).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpserver.registry import ToolSpec
from oauth.credentials import KIND_OAUTH, Principal
from oauth.models import SCOPE_ALL, SCOPE_READ

SCOPE_TO_USE = SCOPE_ALL  # what the 401 asks for: the consent page offers read-only instead
SCOPE_TO_WRITE = SCOPE_ALL  # what every call a read-only credential may not make needs


def scope_refusal(spec: ToolSpec, principal: Principal, arguments: Mapping[str, Any]) -> str | None:
    """The error text if this credential's scope does not allow this call, else None."""
    if not principal.read_only:
        return None
    refused = spec.read_only_refusal(arguments)
    if refused is None:
        return None
    return f"Error: this credential's scope ({SCOPE_READ}) does not allow {refused}"


def may_step_up(principal: Principal) -> bool:
    """Whether the credential's client can ask for a larger scope itself: an OAuth client can authorize again; an
    admin-issued bearer token's scope is the one the admin gave it."""
    return principal.credential_kind == KIND_OAUTH


def bearer_challenge(resource_metadata_url: str, **params: str) -> bytes:
    """A `WWW-Authenticate: Bearer` value: `params` in their order, then `resource_metadata`. Values must be RFC 6750
    quoted-string safe (printable ASCII without '"' or '\\'). `error` goes first and `scope` before any description:
    the SDK clients find a parameter by the first `name=` in the header."""
    pairs = [*params.items(), ("resource_metadata", resource_metadata_url)]
    return ("Bearer " + ", ".join(f'{name}="{value}"' for name, value in pairs)).encode()
