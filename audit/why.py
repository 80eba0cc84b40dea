"""Why a call failed, in one line for the call list: the first line of its finished record's reason (a denial says
why) or else of its result, where a terminal tool's result offers its stderr first.

The text is the agent's or its commands': the list shows it escaped, hidden characters spelled out (audit.visible).
"""

from __future__ import annotations

from audit.filters import FAILED_OUTCOMES
from audit.models import AuditRecord
from audit.visible import one_line

WHY_CHARS = 80  # as the arguments' line: a few lines of a narrow column; the call's page has the whole result
# How a terminal tool's result is written (mcpserver/tools/terminal.py, exec_text): "stdout:" and "stderr:", each
# over its stream's text, then "exit_code: N", joined by blank lines.
STDOUT_HEADER = "stdout:\n"
STDERR_HEADER = "stderr:\n"


def failure_line(finished: AuditRecord | None) -> str:
    """The line that says why the call failed, cut to WHY_CHARS; "" for a call that did not fail (ok, pending) or
    has not finished."""
    if finished is None or finished.outcome not in FAILED_OUTCOMES:
        return ""
    return one_line(first_line(telling_part(finished.reason or finished.result_excerpt)), WHY_CHARS)


def telling_part(text: str) -> str:
    """What of a result says most about a failure: a terminal tool's stderr when it printed some, else its stdout,
    else the whole text."""
    if text.startswith(STDERR_HEADER):
        return text[len(STDERR_HEADER) :]
    stderr_at = text.find(f"\n\n{STDERR_HEADER}")
    if text.startswith(STDOUT_HEADER) and stderr_at != -1:
        return text[stderr_at + 2 + len(STDERR_HEADER) :]
    return text.removeprefix(STDOUT_HEADER)


def first_line(text: str) -> str:
    """The first line with more than whitespace. Only a newline ends a line: a carriage return or another control
    character inside one stays, to be spelled out rather than hide what comes before it."""
    for line in text.split("\n"):
        if line.strip():
            return line.removesuffix("\r")
    return ""
