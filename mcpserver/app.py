"""Assembles the /mcp ASGI application from settings: server, session manager, runner, auth."""

from __future__ import annotations

import asyncio
import logging
import os

from django.conf import settings
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from audit import log as audit_log
from audit.failures import FailureAggregator
from mcpserver.asgi import BearerAuthMiddleware, McpEndpoint
from mcpserver.bodies import JsonBodyGate
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.remote import ExecutorFault, ExecutorLost
from mcpserver.inflight import IN_FLIGHT
from mcpserver.instance import sandstorm_version
from mcpserver.lifecycle import ServerLifecycle
from mcpserver.origins import HostOriginCheck
from mcpserver.revocations import RevocationWatcher
from mcpserver.runner import SessionManagerRunner
from mcpserver.runtime import Runtime, get_runtime
from mcpserver.server import build_server
from mcpserver.sessions import SessionLedger
from mcpserver.transport import install as install_transport
from oauth.credentials import authenticate

logger = logging.getLogger(__name__)


def transport_security() -> TransportSecuritySettings:
    """The SDK's Host and Origin checks off: they compare by prefix. mcpserver.origins.HostOriginCheck, in front
    of everything at /mcp, compares parsed authorities exactly. (The SDK still checks a POST's Content-Type.)"""
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


def resource_metadata_url() -> str:
    return f"{settings.PUBLIC_URL}/.well-known/oauth-protected-resource/mcp"


async def announce_executor(runtime: Runtime) -> None:
    """Start the development child (if that is the mode) and log who runs the tools; never fatal."""
    try:
        identity = await runtime.executor.identity()
    except (ToolFailure, ExecutorLost, ExecutorFault) as error:
        logger.error("the tool executor does not answer on %s: %s", runtime.executor.socket_path, error)
        return
    logger.info(
        "tools run in the executor (pid %s) as OS user %s (uid %s), workspace %s",
        identity["pid"], identity["user"], identity["uid"], identity["root"],
    )  # fmt: skip
    if runtime.executor_child is not None:
        logger.warning(
            "development mode: tools run as OS user %s, the server's own user, so an agent can read the server's "
            "database and keys (see README, Security model); production runs them as the agent user",
            identity["user"],
        )
    if identity["root"] != os.path.realpath(runtime.executor.root):
        logger.warning("the executor's workspace %s is not SANDSTORM_WORKSPACE_ROOT %s", identity["root"], runtime.executor.root)


def session_ledger() -> SessionLedger:
    return SessionLedger(
        per_credential=settings.MAX_SESSIONS_PER_CREDENTIAL,
        per_user=settings.MAX_SESSIONS_PER_USER,
        unused_timeout=settings.SESSION_UNUSED_TIMEOUT,
    )


def build_mcp_application() -> tuple[ASGIApp, SessionManagerRunner]:
    install_transport()  # JSON answers where no stream is needed (mcpserver.transport)
    server = build_server(sandstorm_version())
    server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=transport_security(),
        max_request_body_size=settings.MAX_REQUEST_BYTES,
    )
    failures = FailureAggregator()
    runtime = get_runtime()
    lifecycle = ServerLifecycle(failures, runtime.audit_budget)
    watcher = RevocationWatcher(IN_FLIGHT, runtime.executor)

    async def start() -> None:
        await lifecycle.start()
        await announce_executor(runtime)
        await watcher.start()

    async def stop() -> None:
        await watcher.stop()
        await asyncio.to_thread(audit_log.close)  # every session has ended: write what is queued
        await lifecycle.stop()
        if runtime.executor_child is not None:
            await asyncio.to_thread(runtime.executor_child.stop)

    runner = SessionManagerRunner(server.session_manager, on_start=start, on_stop=stop)
    app = BearerAuthMiddleware(
        JsonBodyGate(McpEndpoint(runner, session_ledger()), max_body_bytes=settings.MAX_REQUEST_BYTES),
        authenticate=authenticate,
        rate_limiter=runtime.rate_limiter,
        resource_metadata_url=resource_metadata_url(),
        failures=failures,
    )
    return HostOriginCheck(app, public_url=settings.PUBLIC_URL), runner
