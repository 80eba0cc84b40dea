"""The /mcp application driven in-process: no Daphne, no port, no executor process.

`serve_in_process` builds the application as sandstorm_site/asgi.py does (mcpserver.application.build_mcp_application), with
a LocalExecutor over a temporary workspace in place of the executor child, and stops it as Daphne's shut-down would.
Requests go through httpx2's ASGI transport, which buffers each answer: a request's answer arrives when its handler
is done, so a stream that never ends (the GET a session client opens for server-initiated messages) would never
answer. Raw JSON-RPC over `http` (2026-07-28 self-contained requests by default) and the SDK client in 2026-07-28
mode open none.

The construction is in `serve_in_process` alone, so that a change to how the application gets its objects changes
one place.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import override_settings
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.types import ASGIApp

from audit.models import AuditRecord
from mcpserver.executor import confinement
from mcpserver.executor.local import LocalExecutor
from mcpserver.lifespan import SessionManagerRunner
from tests import tiers

# The version of the self-contained requests `InProcessServer.call_tool` sends (no handshake, no session).
STATELESS_VERSION = "2026-07-28"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class InProcessExecutor(LocalExecutor):
    """The executor interface in this process, plus what the server asks of the executor child besides tools."""

    socket_path = "the in-process executor of the test"

    async def identity(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "uid": os.getuid(),
            "user": pwd.getpwuid(os.getuid()).pw_name,
            "root": self.root,
            "home": pwd.getpwuid(os.getuid()).pw_dir,
            "disk_free": None,
            "confinement": confinement.active().describe(),
        }


@dataclass
class InProcessServer:
    app: ASGIApp
    runner: SessionManagerRunner
    workspace: Path
    runtime: Any  # mcpserver.services.Services
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def url(self) -> str:
        return f"{settings.PUBLIC_URL}/mcp"

    def http(self, token: str | None = None, **headers: str) -> httpx2.AsyncClient:
        """A client of the application: `token` as the bearer, `headers` (underscores for dashes) on every request."""
        extra = {name.replace("_", "-"): value for name, value in headers.items()}
        if token is not None:
            extra["Authorization"] = f"Bearer {token}"
        transport = httpx2.ASGITransport(app=self.app)
        return httpx2.AsyncClient(
            transport=transport, base_url=settings.PUBLIC_URL, headers={**MCP_HEADERS, **extra}, timeout=60
        )

    async def post(self, token: str | None, message: dict[str, Any], **headers: str) -> httpx2.Response:
        async with self.http(token, **headers) as client:
            return await client.post("/mcp", json=message)

    def tools_call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A self-contained tools/call request (2026-07-28: no session), with an id of its own."""
        return {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": stateless_meta()},
        }

    async def call_tool(self, token: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The `result` of one tools/call (content, isError, ...); fails on any other answer."""
        response = await self.post(token, self.tools_call(name, arguments), **stateless_headers("tools/call", name))
        assert response.status_code == 200, (response.status_code, response.text)
        body = response.json()
        assert "result" in body, body
        return dict(body["result"])

    @contextlib.asynccontextmanager
    async def client(self, token: str) -> AsyncIterator[Client]:
        """The official SDK client over the ASGI transport, in 2026-07-28 mode (no GET stream to wait on)."""
        async with (
            self.http(token) as http,
            Client(streamable_http_client(self.url, http_client=http), mode=STATELESS_VERSION) as client,
        ):
            yield client


def stateless_meta() -> dict[str, Any]:
    """What a 2026-07-28 request carries in `_meta` instead of a handshake."""
    return {
        "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "inprocess", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }


def stateless_headers(method: str, name: str | None = None) -> dict[str, str]:
    """The headers a 2026-07-28 request repeats from its body (the SDK checks that they match it)."""
    headers = {"mcp_protocol_version": STATELESS_VERSION, "mcp_method": method}
    if name is not None:
        headers["mcp_name"] = name
    return headers


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result["content"])


@contextlib.asynccontextmanager
async def serve_in_process(workspace: Path, **setting_overrides: Any) -> AsyncIterator[InProcessServer]:
    """The /mcp application of sandstorm_site/asgi.py, its settings overridden (e.g. RATE_LIMIT_PER_MINUTE=2),
    its executor a LocalExecutor over `workspace`. Needs a transactional database (the server's threads have
    connections of their own). Stopped on exit as at Daphne's shut-down: the session manager, then the audit writer
    and the lifecycle's final records."""
    from mcpserver.application import build_mcp_application
    from mcpserver.services import Services, build_services

    tiers.require("inprocess", "serves the /mcp application in-process")
    workspace.mkdir(parents=True, exist_ok=True)
    with override_settings(WORKSPACE_ROOT=workspace, **setting_overrides):
        services: Services = build_services()
        # The executor interface in this process, in place of the one the settings name (built, never started).
        services.executor = InProcessExecutor(str(workspace), settings.TOOL_ENV_ALLOW, settings.OUTPUT_MAX_BYTES)  # type: ignore[assignment]  # the interface, not the socket client
        services.executor_child = None
        # The sandboxes the executor process would build: the test's workspace, the state dir hidden.
        confinement.configure(confinement.build(str(workspace.resolve()), [str(settings.STATE_DIR)]))
        built = build_mcp_application(services)
        server = InProcessServer(app=built.asgi, runner=built.runner, workspace=workspace, runtime=services)
        runner = built.runner
        try:
            await runner.ensure_started()
            yield server
        finally:
            await runner.stop()


# --- the database, from async tests -----------------------------------------------------------------------------


@sync_to_async
def new_token(name: str, scope: str = "mcp", username: str = "agent") -> str:
    """A bearer token of a user of its own (made if need be, without a password to hash); returns its secret."""
    from oauth.tokens import issue_token

    user, _ = get_user_model().objects.get_or_create(username=username)
    return issue_token(user, name, scope=scope)[1]


@sync_to_async
def audit_records(**filters: Any) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(**filters).order_by("id"))


async def records_of_call(marker: str) -> list[AuditRecord]:
    """The records of the one call whose arguments mention `marker`, in order."""
    started = [record for record in await audit_records(kind="call.started") if marker in str(record.arguments)]
    assert len(started) == 1, started
    return await audit_records(call_id=started[0].call_id)
