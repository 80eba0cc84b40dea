"""Approval through the client's own user (elicitation), against a live server with the official SDK client: asked
only where the deciding rule lets the client's user approve; accept runs the call, decline denies it; a rule that
needs staff sends no elicitation, and its call waits for the console (here: until the hold answers pending), even
when another of its parts is one the client's user may approve."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from mcp_types import ElicitRequestParams, ElicitResult

from tests.live import LiveServer, mcp_client, running_server, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]
POLICY = {
    "rules": [
        {"id": "user-may-approve", "decision": "ask", "commands": ["echo"], "approver": "user"},
        {"id": "staff-only", "decision": "ask", "commands": ["printf"]},
        {"id": "privilege", "decision": "ask", "commands": ["sudo|doas|su|pkexec"]},
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("elicit")
    with running_server(root, SANDSTORM_APPROVAL_HOLD="3", SANDSTORM_APPROVAL_TIMEOUT="60") as live:
        policy = root / "policy.json"
        policy.write_text(json.dumps(POLICY))
        live.manage("policy_load", str(policy))
        yield live


class Answers:
    def __init__(self, action: Literal["accept", "decline", "cancel"], approve: bool) -> None:
        self.action, self.approve = action, approve
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        content: dict[str, str | int | float | bool | list[str] | None] | None = None
        if self.action == "accept":
            content = {"approve": self.approve}
        return ElicitResult(action=self.action, content=content)


def audit_event(server: LiveServer, name: str) -> dict[str, Any]:
    rows = server.database.query("SELECT detail FROM audit_auditrecord WHERE event = %s ORDER BY id DESC", name)
    detail = rows[0]["detail"]
    return detail if isinstance(detail, dict) else json.loads(detail)


async def test_the_clients_user_approves_and_the_call_runs(server: LiveServer) -> None:
    answers = Answers("accept", True)
    marker = uuid.uuid4().hex
    async with mcp_client(server.mcp_url, server.token, elicitation_callback=answers) as client:
        result = await client.call_tool("terminal_exec", {"command": f"echo {marker}"})
    assert not result.is_error and marker in text_of(result)
    assert len(answers.asked) == 1 and f"echo {marker}" in answers.asked[0] and "user-may-approve" in answers.asked[0]
    decided = audit_event(server, "approval.decided")
    assert (decided["decision"], decided["channel"]) == ("approved", "elicitation")


async def test_a_decline_denies_the_call(server: LiveServer) -> None:
    answers = Answers("decline", False)
    marker = uuid.uuid4().hex
    async with mcp_client(server.mcp_url, server.token, elicitation_callback=answers) as client:
        result = await client.call_tool("terminal_exec", {"command": f"echo {marker} > {marker}"})
    assert result.is_error and "declined by" in text_of(result) and "(decline)" in text_of(result)
    assert not (server.workspace / marker).exists()


async def test_an_accept_is_never_asked_for_where_the_rule_needs_staff(server: LiveServer) -> None:
    answers = Answers("accept", True)
    marker = uuid.uuid4().hex
    async with mcp_client(server.mcp_url, server.token, elicitation_callback=answers) as client:
        result = await client.call_tool("terminal_exec", {"command": f"printf {marker} > {marker}"})
    assert answers.asked == []
    assert result.is_error and text_of(result).startswith("Pending:") and "staff-only" in text_of(result)
    assert not (server.workspace / marker).exists()


async def test_a_part_that_needs_staff_is_never_decided_by_the_clients_accept(server: LiveServer) -> None:
    """Issue 31: the rule about `echo` lets the client's user approve, the one about `sudo` does not."""
    answers = Answers("accept", True)
    marker = uuid.uuid4().hex
    async with mcp_client(server.mcp_url, server.token, elicitation_callback=answers) as client:
        result = await client.call_tool("terminal_exec", {"command": f"echo {marker}; sudo -n id; touch {marker}"})
    assert answers.asked == []
    assert result.is_error and text_of(result).startswith("Pending:") and "policy rule privilege" in text_of(result)
    assert not (server.workspace / marker).exists()
    rows = server.database.query(
        "SELECT rule_id, rule_reason, user_may_approve FROM mcpserver_approvalrequest ORDER BY id DESC"
    )
    assert (rows[0]["rule_id"], bool(rows[0]["user_may_approve"])) == ("privilege", False)
    assert "sudo -n id" in rows[0]["rule_reason"]
