"""Step-up with the official SDK clients against a live server: a client that connects from no token and is approved
read-only calls a write tool, gets 403 `insufficient_scope`, sends its user to the consent page again (shown as an
upgrade), and once full access is approved the write runs, in the same MCP session. The Python SDK's
OAuthClientProvider, and the TypeScript SDK's OAuth client (tests/typescript_sdk, run by Node). (The 403 and the
consent page in-process: tests/test_step_up_inprocess.py, tests/test_oauth_consent_upgrade.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from pydantic import AnyUrl

from tests.live import LiveServer
from tests.oauth_flow import LOOPBACK_REDIRECT, AdminSession, MemoryStorage, hidden_inputs, query_of

pytestmark = [pytest.mark.live]

REPO = Path(__file__).resolve().parent.parent
TYPESCRIPT_SDK = REPO / "tests" / "typescript_sdk"
# Set to "required" (CI) to fail, not skip, when Node.js or the TypeScript SDK is not installed.
REQUIRED = os.environ.get("SANDSTORM_TEST_TYPESCRIPT_SDK") == "required"
DEADLINE = 120.0  # seconds for the whole Node.js dialogue on a loaded machine


@pytest.fixture(scope="module")
def server(oauth_server: LiveServer) -> LiveServer:
    return oauth_server


class StaffUser:
    """The staff user in the browser: opens each consent page a client sends them to and answers it, in turn as
    `answers` says ("read-only": "Approve read-only instead"; "approve"); keeps the pages they saw."""

    def __init__(self, admin: AdminSession, answers: list[str]) -> None:
        self.admin = admin
        self.answers = list(answers)
        self.pages: list[str] = []

    def answer(self, url: str) -> str:
        """The query of the redirect back to the client."""
        page = self.admin.consent_page(url)
        assert page.status_code == 200, page.text[:500]
        self.pages.append(page.text)
        form = hidden_inputs(page.text, "consent-form")
        if self.answers.pop(0) == "read-only":
            form["read_only"] = "1"
        else:
            form["allow"] = "Authorize"
        answered = self.admin.http.post(url, data=form, headers={"Referer": url})
        assert answered.status_code == 302, answered.text[:500]
        return urlsplit(answered.headers["location"]).query


def consent_events(server: LiveServer, client_name: str) -> list[dict[str, Any]]:
    sql = "SELECT detail FROM audit_auditrecord WHERE event = 'oauth.consent' ORDER BY id"
    details = [json.loads(row["detail"]) for row in server.database.query(sql)]
    return [detail for detail in details if detail["client"].startswith(client_name)]


def records_of_write(server: LiveServer, marker: str) -> list[tuple[str, str, str, str, str]]:
    """(kind, outcome, scope, reason, protocol version) of the file_write calls whose arguments mention `marker`."""
    sql = (
        "SELECT kind, outcome, scope, reason, protocol_version FROM audit_auditrecord WHERE tool = 'file_write' AND "
        "call_id IN (SELECT call_id FROM audit_auditrecord WHERE kind = 'call.started' AND CAST(arguments AS TEXT) "
        "LIKE %s) ORDER BY id"
    )
    rows = server.database.query(sql, f"%{marker}%")
    return [(row["kind"], row["outcome"], row["scope"], row["reason"], row["protocol_version"]) for row in rows]


def assert_stepped_up(server: LiveServer, staff: StaffUser, client_name: str, marker: str, era: str) -> None:
    """What the server saw: a read-only approval, then an upgrade approved; the write refused once, then run, in
    requests of the protocol version `era`."""
    assert len(staff.pages) == 2 and 'id="upgrade"' not in staff.pages[0] and 'id="upgrade"' in staff.pages[1]
    first, upgrade = consent_events(server, client_name)
    assert (first["scope"], first.get("upgrade_from")) == ("mcp:read", None)
    assert upgrade["upgrade_from"] == "mcp:read" and "mcp" in upgrade["scope"].split()
    refused = "Error: this credential's scope (mcp:read) does not allow file_write"
    full = " ".join(sorted(upgrade["scope"].split()))  # as the audit log writes a credential's scopes
    assert records_of_write(server, marker) == [
        ("call.started", "", "mcp:read", "", era),
        ("call.finished", "denied", "mcp:read", refused, era),
        ("call.started", "", full, "", era),
        ("call.finished", "ok", full, "", era),
    ]
    assert (server.workspace / f"{marker}.txt").read_text() == "stepped up\n"


ERAS = {"legacy": "2025-11-25", "2026-07-28": "2026-07-28"}  # a client's mode, and the version its requests carry


@pytest.mark.anyio
@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_the_python_sdk_client_steps_up_from_read_only_and_the_write_runs(server: LiveServer, mode: str) -> None:
    admin = AdminSession(server)
    staff = StaffUser(admin, ["read-only", "approve"])
    storage = MemoryStorage()
    answered: dict[str, str] = {}

    async def redirect_handler(url: str) -> None:
        answered["query"] = await anyio.to_thread.run_sync(staff.answer, url)

    async def callback_handler() -> AuthorizationCodeResult:
        answer = query_of(f"?{answered['query']}")
        return AuthorizationCodeResult(code=answer["code"], state=answer.get("state"), iss=answer.get("iss"))

    metadata = OAuthClientMetadata(
        client_name=f"Python SDK step-up {mode}",
        redirect_uris=[AnyUrl(LOOPBACK_REDIRECT)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="client_secret_post",
    )
    provider = OAuthClientProvider(
        server_url=server.mcp_url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    marker = uuid.uuid4().hex
    http = httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(60))
    async with http, Client(streamable_http_client(server.mcp_url, http_client=http), mode=mode) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert "file_read" in listed and "file_write" not in listed  # a read-only connection
        result = await client.call_tool("file_write", {"path": f"{marker}.txt", "content": "stepped up\n"})
        assert not result.is_error, result
    admin.close()
    assert [token.scope for token in storage.history] == ["mcp:read", "mcp mcp:read"]
    assert_stepped_up(server, staff, f"Python SDK step-up {mode}", marker, ERAS[mode])


def node_and_sdk() -> list[str]:
    """The command that runs tests/typescript_sdk/step_up.mjs, or a skip (a failure where required) saying what to
    install."""
    installed = TYPESCRIPT_SDK / "node_modules"
    node = installed / ".bin" / "node"  # the Node.js the package pins (24), where npm could install it
    if not node.exists():
        node = Path(shutil.which("node") or "")
    missing = ""
    if not (installed / "@modelcontextprotocol" / "client").is_dir():
        missing = "the TypeScript SDK is not installed (npm ci --prefix tests/typescript_sdk)"
    elif not node.is_file():
        missing = (
            "Node.js is not installed (npm ci --prefix tests/typescript_sdk brings its own; or apt install nodejs)"
        )
    else:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True, check=True).stdout
        if int(version.strip().lstrip("v").split(".")[0]) < 20:
            missing = f"Node.js {version.strip()} is too old for the TypeScript SDK (20 or newer)"
    if missing:
        if REQUIRED:
            pytest.fail(f"SANDSTORM_TEST_TYPESCRIPT_SDK=required, but {missing}")
        pytest.skip(missing)
    return [str(node), str(TYPESCRIPT_SDK / "step_up.mjs")]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", sorted(ERAS))
async def test_the_typescript_sdk_client_steps_up_from_read_only_and_the_write_runs(
    server: LiveServer, mode: str
) -> None:
    command = node_and_sdk()
    admin = AdminSession(server)
    staff = StaffUser(admin, ["read-only", "approve"])
    marker = uuid.uuid4().hex
    said: list[dict[str, Any]] = []
    with anyio.fail_after(DEADLINE):
        async with await anyio.open_process(
            [*command, server.mcp_url, LOOPBACK_REDIRECT, f"{marker}.txt", mode]
        ) as node:
            assert node.stdout is not None and node.stdin is not None
            lines = BufferedByteReceiveStream(node.stdout)
            while len(said) < 4:  # authorize, connected, authorize (the step-up), called
                try:
                    event = json.loads(await lines.receive_until(b"\n", 1 << 20))
                except anyio.IncompleteRead:
                    stderr = await node.stderr.receive() if node.stderr is not None else b""
                    raise AssertionError(f"node ended early after {said}: {stderr.decode(errors='replace')}") from None
                said.append(event)
                if event["event"] == "authorize":
                    query = await anyio.to_thread.run_sync(staff.answer, event["url"])
                    await node.stdin.send(f"{query}\n".encode())
            assert await node.wait() == 0
    admin.close()
    assert [event["event"] for event in said] == ["authorize", "connected", "authorize", "called"]
    connected, called = said[1], said[3]
    assert connected["scope"] == "mcp:read" and "file_write" not in connected["tools"]
    assert not called["isError"] and "mcp" in called["scope"].split(), called
    assert_stepped_up(server, staff, f"TypeScript SDK step-up {mode}", marker, ERAS[mode])
