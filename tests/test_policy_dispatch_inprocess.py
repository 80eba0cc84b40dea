"""The command policy at the dispatch point, through the in-process /mcp application: deny, allow and ask with
the deciding rule in the audit log; approval by a person (approve, deny with a reason, timeout), the hold that
answers "pending" and runs the command in the background once approved, timed grants, and what an approval is
bound to."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async

from audit.log import Actor
from audit.models import AuditRecord
from mcpserver.approvals.requests import DecisionRefused
from mcpserver.approvals.waiting import decide_and_announce
from mcpserver.models import ApprovalRequest, PolicyRule
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy_source import replace_policy
from tests.inprocess import InProcessServer, audit_records, new_token, records_of_call, serve_in_process, text_of

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]
DEADLINE = 30.0
ADMIN = Actor(username="root-admin", credential_kind="session")
ASK_ECHO = {"id": "ask-echo", "decision": "ask", "commands": ["echo"], "description": "echo needs a yes"}
ASK_WRITES = {"id": "ask-writes", "decision": "ask", "tools": ["file_write"], "description": "writes need a yes"}


def policy_of(started: AuditRecord) -> dict[str, Any]:
    assert started.detail is not None
    return dict(started.detail["policy"])


async def set_policy(*rules: dict[str, Any], **settings: Any) -> None:
    await sync_to_async(replace_policy)({"rules": list(rules), **settings}, "test")


async def pending_request(after: int = 0) -> ApprovalRequest:
    with anyio.fail_after(DEADLINE):
        while True:
            found = await ApprovalRequest.objects.filter(pk__gt=after, state="pending").order_by("id").afirst()
            if found is not None:
                return found
            await anyio.sleep(0.02)


async def answer_when_asked(approve: bool, reason: str = "", minutes: int | None = None) -> ApprovalRequest:
    request = await pending_request()
    await decide_and_announce(request.pk, approve, ADMIN, "console", reason, minutes)
    return request


async def call_while(
    app: InProcessServer, token: str, name: str, arguments: dict[str, Any], answer: Any
) -> tuple[dict[str, Any], ApprovalRequest]:
    async with asyncio.TaskGroup() as group:
        call = group.create_task(app.call_tool(token, name, arguments))
        answered = group.create_task(answer)
    return call.result(), answered.result()


async def test_a_deny_rule_refuses_the_call_names_the_rule_and_runs_nothing(mcp_app: InProcessServer) -> None:
    await set_policy(*RECOMMENDED)
    token = await new_token("deny")
    marker = uuid.uuid4().hex
    result = await mcp_app.call_tool(token, "terminal_exec", {"command": f"touch {marker}; shutdown -h now"})
    assert result["isError"] and text_of(result).startswith(
        "Error: the command policy denies this call (rule power-off)"
    )
    assert not (mcp_app.workspace / marker).exists()
    started, finished = await records_of_call(marker)
    assert policy_of(started)["decision"] == "deny" and policy_of(started)["rule"] == "power-off"
    assert finished.outcome == "denied"


async def test_an_allowed_call_names_the_deciding_rule_and_no_policy_names_none(mcp_app: InProcessServer) -> None:
    token = await new_token("allow")
    first = uuid.uuid4().hex
    await mcp_app.call_tool(token, "terminal_exec", {"command": f"echo {first}"})
    started, _ = await records_of_call(first)
    assert started.detail is None  # no policy: today's behaviour, nothing recorded of it
    await set_policy({"id": "allow-ls", "decision": "allow", "commands": ["ls"]}, default="ask")
    second = uuid.uuid4().hex
    result = await mcp_app.call_tool(token, "terminal_exec", {"command": f"ls {second}"})
    assert "No such file or directory" in text_of(result)
    started, _ = await records_of_call(second)
    assert policy_of(started) == {
        "decision": "allow",
        "rule": "allow-ls",
        "reason": policy_of(started)["reason"],
    }


async def test_an_approved_call_runs_and_its_records_tell_who_approved(mcp_app: InProcessServer) -> None:
    await set_policy(ASK_ECHO)
    token = await new_token("ask")
    marker = uuid.uuid4().hex
    result, request = await call_while(
        mcp_app, token, "terminal_exec", {"command": f"echo {marker}"}, answer_when_asked(True)
    )
    assert not result["isError"] and marker in text_of(result)
    started, finished = await records_of_call(marker)
    assert policy_of(started)["decision"] == "ask" and policy_of(started)["rule"] == "ask-echo"
    assert finished.outcome == "ok"
    request = await ApprovalRequest.objects.aget(pk=request.pk)
    assert (request.state, request.decided_by, request.channel, request.call_id) == (
        "approved", "root-admin", "console", started.call_id
    )  # fmt: skip
    event = await AuditRecord.objects.filter(event="approval.decided").alast()
    assert event is not None and event.detail is not None
    assert (event.detail["request"], event.detail["decision"]) == (request.label, "approved")


async def test_a_denial_gives_the_agent_the_reason_verbatim_and_runs_nothing(mcp_app: InProcessServer) -> None:
    await set_policy(ASK_ECHO)
    token = await new_token("deny-reason")
    marker = uuid.uuid4().hex
    reason = "not on a Friday <b>really</b> 'quoted'"
    result, request = await call_while(
        mcp_app, token, "terminal_exec", {"command": f"echo {marker} > {marker}"}, answer_when_asked(False, reason)
    )
    assert result["isError"]
    assert text_of(result) == (
        f"Error: root-admin denied this call (request {request.label}, policy rule ask-echo): {reason}"
    )
    assert not (mcp_app.workspace / marker).exists()
    _, finished = await records_of_call(marker)
    assert finished.outcome == "denied"


async def test_no_answer_is_a_denial(tmp_path: Path, transactional_db: None) -> None:
    async with serve_in_process(tmp_path / "ws", APPROVAL_TIMEOUT=1, APPROVAL_HOLD=45) as app:
        await set_policy(ASK_ECHO)
        token = await new_token("timeout")
        marker = uuid.uuid4().hex
        result = await app.call_tool(token, "terminal_exec", {"command": f"echo {marker} > {marker}"})
        assert result["isError"] and text_of(result).startswith("Error: no one answered approval request R-")
        assert "within 1 second, so the call was not run (policy rule ask-echo)" in text_of(result)
        assert not (app.workspace / marker).exists()
        request = await ApprovalRequest.objects.alast()
        assert request is not None and (request.state, request.channel) == ("timed_out", "timeout")
        # A decision after the time is refused, and changes nothing.
        with pytest.raises(DecisionRefused, match="already decided: timed out"):
            await decide_and_announce(request.pk, True, ADMIN, "console")


async def test_the_hold_answers_pending_then_the_approved_command_runs_in_the_background(
    tmp_path: Path, transactional_db: None
) -> None:
    async with serve_in_process(tmp_path / "ws", APPROVAL_TIMEOUT=60, APPROVAL_HOLD=1) as app:
        await set_policy(ASK_ECHO)
        token = await new_token("hold")
        marker = uuid.uuid4().hex
        result = await app.call_tool(token, "terminal_exec", {"command": f"echo {marker}"})
        request = await ApprovalRequest.objects.alast()
        assert request is not None and request.held
        assert result["isError"] and text_of(result).startswith(
            f"Pending: this call waits for an administrator's approval as request {request.label}"
        )
        _, finished = await records_of_call(marker)
        assert finished.outcome == "pending"
        listed = await app.call_tool(token, "terminal_list", {})
        assert f"{request.label}  pending approval" in text_of(listed)
        still = await app.call_tool(token, "terminal_output", {"id": request.label})
        assert not still["isError"] and still["structuredContent"]["state"] == "pending_approval"
        await decide_and_announce(request.pk, True, ADMIN, "console")
        found = await app.call_tool(token, "terminal_output", {"id": request.label, "wait_ms": 20000})
        with anyio.fail_after(DEADLINE):
            while found["structuredContent"]["state"] == "running":
                found = await app.call_tool(token, "terminal_output", {"id": request.label, "wait_ms": 5000})
        assert found["structuredContent"]["state"] == "exited" and marker in text_of(found)
        event = await AuditRecord.objects.filter(event="approval.run_in_background").alast()
        assert event is not None and event.detail is not None and event.detail["request"] == request.label


async def test_a_held_file_call_runs_once_when_called_again_after_approval(
    tmp_path: Path, transactional_db: None
) -> None:
    async with serve_in_process(tmp_path / "ws", APPROVAL_TIMEOUT=60, APPROVAL_HOLD=1) as app:
        await set_policy(ASK_WRITES)
        token = await new_token("again")
        arguments = {"path": "note.txt", "content": "approved\n"}
        first = await app.call_tool(token, "file_write", arguments)
        assert first["isError"] and "call file_write again with the same arguments" in text_of(first)
        request = await ApprovalRequest.objects.alast()
        assert request is not None
        await decide_and_announce(request.pk, True, ADMIN, "console")
        other = await app.call_tool(token, "file_write", {"path": "note.txt", "content": "something else\n"})
        assert other["isError"] and text_of(other).startswith("Pending:")  # other arguments: asked anew
        again = await app.call_tool(token, "file_write", arguments)
        assert not again["isError"] and (app.workspace / "note.txt").read_text() == "approved\n"
        third = await app.call_tool(token, "file_write", arguments)
        assert third["isError"] and text_of(third).startswith("Pending:")  # single use


async def test_a_timed_grant_covers_the_same_command_shape_of_the_same_credential_only(
    mcp_app: InProcessServer,
) -> None:
    await set_policy(ASK_ECHO)
    token = await new_token("grant")
    first = uuid.uuid4().hex
    result, request = await call_while(
        mcp_app, token, "terminal_exec", {"command": f"echo -n {first}"}, answer_when_asked(True, minutes=10)
    )
    assert not result["isError"]
    second = uuid.uuid4().hex
    granted = await mcp_app.call_tool(token, "terminal_exec", {"command": f"echo -n {second}"})
    assert not granted["isError"] and second in text_of(granted)
    started, _ = await records_of_call(second)
    assert policy_of(started)["approved"] == {"by": "root-admin", "through": "grant", "request": request.label}
    # Another shape (no -n), or another credential: asked again (answered with a denial here).
    third = uuid.uuid4().hex
    other_shape, _ = await call_while(
        mcp_app, token, "terminal_exec", {"command": f"echo {third}"}, answer_when_asked(False, "no")
    )
    other_token = await new_token("grant-other")
    fourth = uuid.uuid4().hex
    other_credential, _ = await call_while(
        mcp_app, other_token, "terminal_exec", {"command": f"echo -n {fourth}"}, answer_when_asked(False, "no")
    )
    assert other_shape["isError"] and other_credential["isError"]


async def test_a_command_the_parser_cannot_see_through_asks(mcp_app: InProcessServer) -> None:
    await set_policy(*RECOMMENDED)
    token = await new_token("opaque")
    marker = uuid.uuid4().hex
    result, request = await call_while(
        mcp_app, token, "terminal_exec", {"command": f'X="echo {marker}"; eval "$X"'}, answer_when_asked(False, "no")
    )
    assert result["isError"] and request.rule_id == "opaque"


async def test_a_stored_rule_that_no_longer_reads_denies_every_call(mcp_app: InProcessServer) -> None:
    await set_policy(ASK_ECHO)
    await PolicyRule.objects.filter(rule_id="ask-echo").aupdate(spec={"id": "ask-echo", "decision": "perhaps"})
    from mcpserver.policy_source import POLICY

    POLICY.forget()
    token = await new_token("broken")
    result = await mcp_app.call_tool(token, "file_list", {})
    assert result["isError"] and "the command policy cannot be read" in text_of(result)


async def test_a_cancelled_wait_cancels_its_request(mcp_app: InProcessServer) -> None:
    await set_policy(ASK_ECHO)
    token = await new_token("cancel")
    with anyio.move_on_after(1.0):
        await mcp_app.call_tool(token, "terminal_exec", {"command": "echo bye"})
    with anyio.fail_after(DEADLINE):
        while (request := await ApprovalRequest.objects.alast()) is None or request.state == "pending":
            await anyio.sleep(0.05)
    assert (request.state, request.channel) == ("cancelled", "ended")


async def test_an_approval_after_the_credential_was_revoked_starts_nothing(
    tmp_path: Path, transactional_db: None
) -> None:
    from oauth.models import BearerToken
    from oauth.tokens import revoke_tokens

    async with serve_in_process(tmp_path / "ws", APPROVAL_TIMEOUT=60, APPROVAL_HOLD=1) as app:
        await set_policy(ASK_ECHO)
        token = await new_token("revoked-later")
        marker = uuid.uuid4().hex
        result = await app.call_tool(token, "terminal_exec", {"command": f"echo {marker} > {marker}"})
        assert text_of(result).startswith("Pending:")
        request = await ApprovalRequest.objects.alast()
        assert request is not None
        await sync_to_async(revoke_tokens)(BearerToken.objects.filter(name="revoked-later"), None)
        await decide_and_announce(request.pk, True, ADMIN, "console")
        with anyio.fail_after(DEADLINE):
            while not (request := await ApprovalRequest.objects.aget(pk=request.pk)).outcome:
                await anyio.sleep(0.05)
        assert request.outcome == "not started: its credential was revoked" and request.background_id is None
        await anyio.sleep(0.3)
        assert not (app.workspace / marker).exists()


async def test_a_grant_for_a_command_run_as_another_user_covers_only_those_words(mcp_app: InProcessServer) -> None:
    """Issue 31: a grant for `sudo -n true` covered `sudo` with any other arguments."""
    await set_policy({"id": "privilege", "decision": "ask", "commands": ["sudo"]})
    token = await new_token("sudo-grant")
    first = uuid.uuid4().hex
    command = f"sudo -n echo {first}"
    _, request = await call_while(
        mcp_app, token, "terminal_exec", {"command": command}, answer_when_asked(True, minutes=10)
    )
    await mcp_app.call_tool(token, "terminal_exec", {"command": command})  # the same words: the grant covers it
    records = [record for record in await audit_records(kind="call.started") if first in str(record.arguments)]
    assert policy_of(records[-1])["approved"] == {"by": "root-admin", "through": "grant", "request": request.label}
    other = uuid.uuid4().hex
    result, asked = await call_while(
        mcp_app, token, "terminal_exec", {"command": f"sudo -n echo {other}"}, answer_when_asked(False, "no")
    )
    assert result["isError"] and asked.pk != request.pk and asked.rule_id == "privilege"
