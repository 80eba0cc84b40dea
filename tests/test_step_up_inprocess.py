"""Step-up at /mcp in-process (mcpserver.step_up): a read-only OAuth credential's call that its scope refuses gets 403
`insufficient_scope` naming `mcp` before the SDK sees it, audited as dispatch audits a denial; a bearer token keeps the
tool error; what the scope allows passes. (The consent page's upgrade: tests/test_oauth_consent_page.py; the SDK
clients stepping up against a live server: tests/test_oauth_step_up_live.py.)"""

from __future__ import annotations

import secrets
import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

import mcpserver.dispatch
import mcpserver.step_up
from audit.models import AuditRecord
from tests.inprocess import (
    InProcessServer,
    audit_records,
    new_token,
    records_of_call,
    stateless_headers,
    stateless_meta,
    text_of,
)
from tests.live import INITIALIZE

pytestmark = [pytest.mark.inprocess, pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

RESOURCE_METADATA = f'resource_metadata="{settings.PUBLIC_URL}/.well-known/oauth-protected-resource/mcp"'


@sync_to_async
def oauth_token(scope: str) -> str:
    """An access token of a connected app for our resource, of a user of its own, as the token endpoint issues them."""
    from oauth2_provider.models import AccessToken, Application, set_token_value

    user = get_user_model().objects.get_or_create(username="approver")[0]
    application = Application.objects.create(
        name="Step-up client",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1:33418/callback",
        user=user,
    )
    raw = secrets.token_urlsafe(32)
    token = AccessToken(
        application=application,
        user=user,
        scope=scope,
        resource=[settings.MCP_RESOURCE_URL],
        expires=timezone.now() + timedelta(hours=1),
    )
    set_token_value(token, raw)
    token.save()
    return raw


async def call(server: InProcessServer, token: str, tool: str, arguments: dict[str, Any], **headers: str) -> Any:
    """The answer to one tools/call (2026-07-28, no session unless `headers` name one)."""
    message = server.tools_call(tool, arguments)
    return await server.post(token, message, **(headers or stateless_headers("tools/call", tool)))


def challenge_for(refused: str) -> str:
    return (
        f'Bearer error="insufficient_scope", scope="mcp", error_description="this credential\'s scope (mcp:read) '
        f'does not allow {refused}", {RESOURCE_METADATA}'
    )


async def test_a_read_only_oauth_credential_calling_a_write_tool_gets_403_insufficient_scope(
    mcp_app: InProcessServer,
) -> None:
    reader = await oauth_token("mcp:read")
    marker = uuid.uuid4().hex
    response = await call(mcp_app, reader, "terminal_exec", {"command": f"touch {marker}"})
    assert response.status_code == 403
    assert response.headers["www-authenticate"] == challenge_for("terminal_exec")
    answer = response.json()
    assert answer["error"]["code"] == mcpserver.step_up.INSUFFICIENT_SCOPE and answer["id"] is not None
    assert answer["error"]["message"].startswith(
        "Error: this credential's scope (mcp:read) does not allow terminal_exec. Its app can ask for full access"
    )
    assert not (mcp_app.workspace / marker).exists()


async def test_the_refusal_is_audited_as_a_bearer_tokens_denial_is(mcp_app: InProcessServer) -> None:
    """The same started and finished records as dispatch writes for the same call of a read-only bearer token (which
    keeps its tool error): tool, arguments as the tool gets them, reason, outcome."""
    oauth_marker, bearer_marker = uuid.uuid4().hex, uuid.uuid4().hex
    refused = await call(mcp_app, await oauth_token("mcp:read"), "terminal_exec", {"command": f"echo {oauth_marker}"})
    bearer = await new_token("reader", scope="mcp:read")
    answered = await mcp_app.call_tool(bearer, "terminal_exec", {"command": f"echo {bearer_marker}"})
    assert refused.status_code == 403
    assert answered["isError"] and text_of(answered) == (
        "Error: this credential's scope (mcp:read) does not allow terminal_exec"
    )

    def shape(record: AuditRecord, marker: str) -> tuple[Any, ...]:
        arguments = record.arguments and {
            **record.arguments,
            "command": record.arguments["command"].replace(marker, "M"),
        }
        return record.kind, record.tool, arguments, record.outcome, record.reason, record.scope, record.protocol_version

    via_oauth, via_bearer = await records_of_call(oauth_marker), await records_of_call(bearer_marker)
    assert [shape(r, oauth_marker) for r in via_oauth] == [shape(r, bearer_marker) for r in via_bearer]
    assert [(r.kind, r.outcome) for r in via_oauth] == [("call.started", ""), ("call.finished", "denied")]
    assert via_oauth[0].credential_kind == "oauth" and via_oauth[0].username == "approver"


async def test_a_read_only_bearer_token_keeps_the_tool_error(mcp_app: InProcessServer) -> None:
    """An admin-issued token cannot be widened by any flow its client could run: a 403 would only end the call."""
    reader = await new_token("reader", scope="mcp:read")
    response = await call(mcp_app, reader, "file_write", {"path": "x.txt", "content": "no"})
    assert response.status_code == 200 and "www-authenticate" not in response.headers
    assert text_of(response.json()["result"]) == "Error: this credential's scope (mcp:read) does not allow file_write"
    assert not (mcp_app.workspace / "x.txt").exists()


async def test_what_the_read_only_scope_allows_passes_and_what_depends_on_arguments_is_decided_by_them(
    mcp_app: InProcessServer,
) -> None:
    reader = await oauth_token("mcp:read")
    (mcp_app.workspace / "seen.txt").write_text("seen\n")
    read = await call(mcp_app, reader, "file_read", {"path": "seen.txt"})
    listing = await call(mcp_app, reader, "git_branch", {})
    creating = await call(mcp_app, reader, "git_branch", {"name": "feature"})
    assert read.status_code == 200 and text_of(read.json()["result"]) == "seen\n"
    assert listing.status_code == 200
    assert creating.status_code == 403
    assert creating.headers["www-authenticate"] == challenge_for("git_branch with name")


async def test_a_full_scope_oauth_credential_is_never_challenged(mcp_app: InProcessServer) -> None:
    writer = await oauth_token("mcp mcp:read")  # what an SDK client holds after stepping up: both scopes
    response = await call(mcp_app, writer, "file_write", {"path": "made.txt", "content": "yes"})
    assert response.status_code == 200 and not response.json()["result"]["isError"]
    assert (mcp_app.workspace / "made.txt").read_text() == "yes"


async def test_in_a_session_the_403_leaves_the_session_usable(mcp_app: InProcessServer) -> None:
    reader = await oauth_token("mcp:read")
    opened = await mcp_app.post(reader, INITIALIZE)
    assert opened.status_code == 200, opened.text
    session = {"mcp_session_id": opened.headers["mcp-session-id"], "mcp_protocol_version": "2025-11-25"}
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "file_write", "arguments": {}}}
    refused = await mcp_app.post(reader, message, **session)
    assert refused.status_code == 403 and refused.json()["id"] == 7
    assert refused.headers["www-authenticate"] == challenge_for("file_write")
    listed = await mcp_app.post(reader, {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}, **session)
    assert listed.status_code == 200, listed.text
    finished = await audit_records(kind="call.finished", tool="file_write")
    assert [(r.outcome, r.session_id, r.protocol_version) for r in finished] == [
        ("denied", session["mcp_session_id"], "2025-11-25")
    ]


async def test_an_unknown_tool_is_left_to_the_sdk(mcp_app: InProcessServer) -> None:
    reader = await oauth_token("mcp:read")
    message = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "no_such_tool", "arguments": {}, "_meta": stateless_meta()},
    }
    response = await mcp_app.post(reader, message, **stateless_headers("tools/call", "no_such_tool"))
    assert response.status_code != 403 and "www-authenticate" not in response.headers


def test_the_gate_and_dispatch_decide_with_one_function() -> None:
    """No second authorization path that could disagree: the gate calls dispatch's own decision."""
    assert mcpserver.step_up.scope_refusal is mcpserver.dispatch.scope_refusal
