"""The actions a console page sends on its live socket (mcpserver.console_socket), every field checked before
anything is done: approve (once, or with a timed grant), deny (with a reason), stop a running call, stop a
background command; and the model permission each needs."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcpserver.approvals.requests import MAX_GRANT_MINUTES, MAX_REASON

_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_REF_CHARS = 40


# --- what a page asks --------------------------------------------------------------------------------------------


class ActionRefused(Exception):
    """An action that is not taken; the message says why."""


@dataclass(frozen=True)
class Action:
    name: str
    ref: str | int | None  # echoed in the result, so the page knows which button it answers
    values: dict[str, Any]


def _positive_int(content: Mapping[str, Any], key: str) -> int:
    value = content.get(key)
    if type(value) is not int or not 0 < value < 2**63:  # not bool, which is an int too
        raise ActionRefused(f"{key}: a positive whole number is needed")
    return value


def _text(content: Mapping[str, Any], key: str, limit: int) -> str:
    value = content.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise ActionRefused(f"{key}: text of at most {limit} characters is needed")
    return value


def _approve(content: Mapping[str, Any]) -> dict[str, Any]:
    minutes = content.get("minutes")
    if minutes is not None and (type(minutes) is not int or not 1 <= minutes <= MAX_GRANT_MINUTES):
        raise ActionRefused(f"minutes: a whole number from 1 to {MAX_GRANT_MINUTES}, or null for this call only")
    return {"id": _positive_int(content, "id"), "minutes": minutes}


def _deny(content: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": _positive_int(content, "id"), "reason": _text(content, "reason", MAX_REASON).strip()}


def _stop(content: Mapping[str, Any]) -> dict[str, Any]:
    call_id = content.get("call_id")
    if not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
        raise ActionRefused("call_id: a call id is needed")
    return {"call_id": call_id}


def _stop_background(content: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": _positive_int(content, "id")}


# action: (its fields besides "action" and "ref", their parser)
ACTIONS: dict[str, tuple[frozenset[str], Callable[[Mapping[str, Any]], dict[str, Any]]]] = {
    "approve": (frozenset({"id", "minutes"}), _approve),
    "deny": (frozenset({"id", "reason"}), _deny),
    "stop": (frozenset({"call_id"}), _stop),
    "stop_background": (frozenset({"id"}), _stop_background),
}
# Staff who may only view the console (view_* permissions) see everything but change nothing: deciding needs the
# change permission of approval requests, stopping what an agent runs that of background commands.
DECIDE = "mcpserver.change_approvalrequest"
STOP = "mcpserver.change_backgroundprocess"
PERMISSIONS = {"approve": DECIDE, "deny": DECIDE, "stop": STOP, "stop_background": STOP}


def ref_of(content: object) -> str | int | None:
    """The action's `ref` if it is one a result may echo (a short text or a safe integer), else None."""
    ref = content.get("ref") if isinstance(content, dict) else None
    if (isinstance(ref, str) and len(ref) <= _REF_CHARS) or (type(ref) is int and abs(ref) < 2**53):
        return ref
    return None


def parse_action(content: object) -> Action:
    """An action from the page, every field checked; ActionRefused otherwise."""
    if not isinstance(content, dict):
        raise ActionRefused("an action is a JSON object")
    name = content.get("action")
    if not isinstance(name, str) or name not in ACTIONS:
        raise ActionRefused(f"unknown action (known: {', '.join(ACTIONS)})")
    ref = ref_of(content)
    if ref is None and content.get("ref") is not None:
        raise ActionRefused(f"ref: a number or at most {_REF_CHARS} characters")
    fields, parser = ACTIONS[name]
    unknown = sorted(set(content) - fields - {"action", "ref"})
    if unknown:
        raise ActionRefused(f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)[:200]}")
    return Action(name, ref, parser(content))
