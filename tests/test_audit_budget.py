"""The audit log's disk budget (SANDSTORM_AUDIT_MAX_BYTES): a flood of calls, even with a read-only token, stops at
the budget with a clear error, is not recorded call by call, and /health and the overview tell the admin."""

from __future__ import annotations

import base64
import os
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from audit.budget import AuditBudget, BudgetState, audit_log_bytes, refusal_text
from audit.log.append import append_all
from audit.models import KIND_EVENT, AuditRecord
from tests.live import make_server, mcp_client, text_of

FLOOD_CALLS = 1000  # at most; the budget below is reached after about 150
FLOOD_SECONDS = 120.0


@pytest.mark.anyio
async def test_the_size_is_measured_at_most_once_per_interval_and_refusals_are_counted() -> None:
    measures: list[int] = []

    def measure() -> int:
        measures.append(1)
        return 2000

    budget = AuditBudget(1000, measure, every=60.0)
    for _ in range(50):
        assert await budget.refusal() == refusal_text(BudgetState(2000, 1000))
    assert len(measures) == 1
    assert budget.drain_refused() == (50, BudgetState(2000, 1000))
    assert budget.drain_refused()[0] == 0
    assert await AuditBudget(0, measure).refusal() is None and len(measures) == 1  # 0: no budget, never measured


def test_the_refusal_tells_the_agent_and_the_admin_what_to_do() -> None:
    text = refusal_text(BudgetState(11 * 1024**3, 10 * 1024**3))
    assert "11.0 GiB of its 10.0 GiB budget" in text and "SANDSTORM_AUDIT_MAX_BYTES" in text
    assert "audit_prune" in text and "audit_export" in text and "not run" in text


@pytest.mark.django_db(transaction=True)
def test_the_measured_size_grows_with_the_records_written() -> None:
    before = audit_log_bytes()
    # Random text: PostgreSQL compresses what it stores out of line (TOAST), and 200,000 equal letters take a page.
    incompressible = base64.b64encode(os.urandom(150_000)).decode()
    append_all([AuditRecord(kind=KIND_EVENT, event="big", detail={"x": incompressible})])
    assert audit_log_bytes() >= before + 150_000


def audit_bytes(server_url: str) -> dict[str, Any]:
    return httpx2.get(f"{server_url}/health", timeout=10).json()["audit_log"]


@pytest.mark.live
def test_a_flood_from_a_read_only_token_is_refused_at_the_budget_and_no_longer_recorded(tmp_path: Path) -> None:
    server = make_server(tmp_path, SANDSTORM_AUDIT_MAX_BYTES=str(1024**4), SANDSTORM_RATE_LIMIT="0")
    server.start()
    token = server.create_token("reader", scope="mcp:read")
    used = audit_bytes(server.url)["bytes"]
    server.stop()
    budget = int(used) + 2 * 1024 * 1024
    server.env["SANDSTORM_AUDIT_MAX_BYTES"] = str(budget)
    server.start()
    try:
        refused = anyio.run(flood, server.mcp_url, token)
        assert "the audit log is full" in refused and "SANDSTORM_AUDIT_MAX_BYTES" in refused
        started = server.database.query("SELECT COUNT(*) AS n FROM audit_auditrecord WHERE kind = 'call.started'")[0][
            "n"
        ]
        anyio.run(more_calls, server.mcp_url, token, 30)
        after = server.database.query("SELECT COUNT(*) AS n FROM audit_auditrecord WHERE kind = 'call.started'")[0]["n"]
        assert after == started  # refused calls are counted, not recorded one by one
        health = httpx2.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 503 and health.json()["audit_log"]["full"] is True
        assert health.json()["audit_log"]["max_bytes"] == budget
    finally:
        server.stop()
    events = server.database.query("SELECT detail FROM audit_auditrecord WHERE event = 'audit.full'")
    assert events, "the refused calls are recorded as one event (at the minute tick or at shut-down)"


async def flood(url: str, token: str) -> str:
    """Denied calls with a large argument (a read-only token may not run commands), until one is refused."""
    deadline = time.monotonic() + FLOOD_SECONDS
    async with mcp_client(url, token) as client:
        for _ in range(FLOOD_CALLS):
            # Random text: PostgreSQL compresses what it stores out of line, and 100,000 equal letters take little.
            result = await client.call_tool("terminal_exec", {"command": "echo " + secrets.token_hex(50_000)})
            text = text_of(result)
            if "audit log is full" in text:
                return text
            assert "does not allow" in text
            if time.monotonic() > deadline:
                break
    raise AssertionError("the flood was never refused")


async def more_calls(url: str, token: str, count: int) -> None:
    async with mcp_client(url, token) as client:
        for _ in range(count):
            assert "audit log is full" in text_of(await client.call_tool("workspace_info", {}))


@pytest.mark.django_db
def test_the_overview_tells_the_admin_when_the_log_is_full(admin_client: Any, settings: Any) -> None:
    settings.AUDIT_MAX_BYTES = 1
    page = admin_client.get("/admin/audit/overview/").content.decode()
    assert 'id="audit-budget" class="errornote"' in page and "The log is full" in page and "audit_prune" in page
    settings.AUDIT_MAX_BYTES = 1024**4
    page = admin_client.get("/admin/audit/overview/").content.decode()
    assert "Audit log size:" in page and "The log is full" not in page
