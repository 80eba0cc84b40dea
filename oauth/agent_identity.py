"""The OS user the agent's tools run as, for the consent page.

oauth sits below mcpserver and cannot ask the tool executor itself: the MCP server tells this module who the
executor runs as when it has asked (at start-up, and again whenever it learns), and the page reads the last answer.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_agent_user: str | None = None


def remember_agent_user(user: str | None) -> None:
    """Record the executor's OS user (None: it did not answer)."""
    global _agent_user
    with _lock:
        _agent_user = user


def agent_user() -> str | None:
    """The executor's OS user as last reported, or None if no server in this process has reported one."""
    with _lock:
        return _agent_user
