"""A hostile body sent to /mcp through a real Daphne: 400 with a JSON-RPC parse error, and no traceback or error in
the server's log.

The refusals of every hostile body in every era, and a session's answers after them, are in tests/test_mcp_parse.py
(in-process, the body handed on as Daphne does). This one body stays live for what only the real stack does with
it: Twisted reads 1.2 MB of it (spooled to a file past 100 KB), Daphne hands it on in ~150 messages, and the log is
the server's own stdout and stderr, where Twisted and Daphne write too, not just Python's loggers in this process."""

from __future__ import annotations

import httpx2
import pytest

from tests.live import MCP_HEADERS, LiveServer, auth_headers
from tests.test_mcp_parse import HOSTILE_BODIES, PARSE_ERROR

pytestmark = [pytest.mark.live]


def test_a_deeply_nested_body_gets_400_and_a_json_rpc_error_without_a_traceback(live_server: LiveServer) -> None:
    headers = {**MCP_HEADERS, **auth_headers(live_server.token)}
    log_before = len(live_server.log())
    answer = httpx2.post(live_server.mcp_url, content=HOSTILE_BODIES["nested objects"], headers=headers, timeout=30)
    assert answer.status_code == 400, (answer.status_code, answer.text[:300])
    error = answer.json()["error"]
    assert error["code"] == PARSE_ERROR, error
    logged = live_server.log()[log_before:]
    assert "Traceback" not in logged and '"level": "ERROR"' not in logged, logged[-2000:]
