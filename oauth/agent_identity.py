"""The OS user the agent's tools run as, for the consent page and the console's home page.

oauth sits below mcpserver and cannot ask the tool executor itself: the MCP server tells this module who the
executor runs as when it has asked (at start-up, and again on each /health), and the pages read the last answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

UNREPORTED_AGENT_USER = "the agent user (the tool executor has not reported yet)"
_lock = threading.Lock()
_agent_user: str | None = None
_report: ExecutorReport | None = None
_confinement: dict[str, Any] | None = None


@dataclass(frozen=True)
class ExecutorReport:
    """What the MCP server in this process last learnt: the executor's OS user (None: it did not answer), and when."""

    user: str | None
    at: datetime


def remember_agent_user(user: str | None, confinement: dict[str, Any] | None = None) -> None:
    """Record the executor's OS user (None: it did not answer) and what it said of its kernel confinement."""
    global _agent_user, _report, _confinement
    with _lock:
        _agent_user = user
        _report = ExecutorReport(user, timezone.now())
        if confinement is not None:
            _confinement = confinement


def kernel_confinement() -> dict[str, Any] | None:
    """What the executor last said of its sandboxes ({"landlock_abi", "profiles": {name: "enforced" or why
    not}}), or None if no executor has answered in this process."""
    with _lock:
        return _confinement


def workspace_confinement_enforced() -> bool | None:
    """Whether the executor can enforce the `workspace` profile; None when no executor has said."""
    described = kernel_confinement()
    if described is None:
        return None
    profiles = described.get("profiles")
    return isinstance(profiles, dict) and profiles.get("workspace") == "enforced"


def agent_user() -> str | None:
    """The executor's OS user as last reported, or None if no server in this process has reported one."""
    with _lock:
        return _agent_user


def agent_os_user() -> str:
    """The OS user the tools run as, as the executor last reported it to the MCP server (in production not the
    server's own user), in words; never asked from here, so a page never waits for the executor."""
    return agent_user() or UNREPORTED_AGENT_USER


def executor_report() -> ExecutorReport | None:
    """The last report, or None when no MCP server in this process has asked the executor (e.g. the admin served
    by `manage.py runserver`, apart from /mcp)."""
    with _lock:
        return _report
