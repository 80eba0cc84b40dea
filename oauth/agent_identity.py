"""The OS user the agent's tools run as, for the consent page and the console's home page.

oauth sits below mcpserver and cannot ask the tool executor itself: the MCP server tells this module who the
executor runs as when it has asked (at start-up, and again on each /health), and the pages read the last answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

_lock = threading.Lock()
_agent_user: str | None = None
_report: ExecutorReport | None = None


@dataclass(frozen=True)
class ExecutorReport:
    """What the MCP server in this process last learnt: the executor's OS user (None: it did not answer), and when."""

    user: str | None
    at: datetime


def remember_agent_user(user: str | None) -> None:
    """Record the executor's OS user (None: it did not answer)."""
    global _agent_user, _report
    with _lock:
        _agent_user = user
        _report = ExecutorReport(user, timezone.now())


def agent_user() -> str | None:
    """The executor's OS user as last reported, or None if no server in this process has reported one."""
    with _lock:
        return _agent_user


def executor_report() -> ExecutorReport | None:
    """The last report, or None when no MCP server in this process has asked the executor (e.g. the admin served
    by `manage.py runserver`, apart from /mcp)."""
    with _lock:
        return _report
