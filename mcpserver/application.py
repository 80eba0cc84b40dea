"""The ASGI application factory for /mcp: builds, from the settings of the moment, the services one server process
shares (mcpserver.services), the MCPServer with the tools, the session manager's runner, and the middleware in front.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from audit import log as audit_log
from audit.failures import FailureAggregator
from mcpserver.approvals.holds import stop_waiting
from mcpserver.approvals.requests import cancel_orphaned
from mcpserver.authentication import BearerAuthMiddleware
from mcpserver.bodies import JsonBodyGate
from mcpserver.confinement_profile import protections
from mcpserver.endpoint import McpEndpoint
from mcpserver.executor.confinement import HOST
from mcpserver.executor.interface import ExecutorError
from mcpserver.guard import JsonErrors
from mcpserver.inflight import IN_FLIGHT
from mcpserver.job_recordings import JobRecorder
from mcpserver.lifespan import Housekeeping, SessionManagerRunner
from mcpserver.origins import HostOriginCheck
from mcpserver.process import INSTANCE_ID, sandstorm_version
from mcpserver.revocations import RevocationWatcher
from mcpserver.services import Services, build_services, register
from mcpserver.shared_limits import SharedSessionLedger
from mcpserver.step_up import StepUpGate
from mcpserver.stopping import StopGate
from mcpserver.tool_server import build_server
from mcpserver.transport import install as install_transport
from mcpserver.workers import WorkerBus, ask_workers_to_end_idle_session
from oauth.agent_identity import remember_agent_user
from oauth.credentials import build_authenticator

logger = logging.getLogger(__name__)


def transport_security() -> TransportSecuritySettings:
    """The SDK's Host and Origin checks off: they compare by prefix. mcpserver.origins.HostOriginCheck, in front
    of everything at /mcp, compares parsed authorities exactly. (The SDK still checks a POST's Content-Type.)"""
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


def resource_metadata_url() -> str:
    return f"{settings.PUBLIC_URL}/.well-known/oauth-protected-resource/mcp"


async def announce_executor(services: Services) -> None:
    """Start the development child (if that is the mode), log who runs the tools and tell the consent page
    (oauth.agent_identity); never fatal."""
    try:
        identity = await services.executor.identity()
    except ExecutorError as error:
        logger.error("the tool executor does not answer on %s: %s", services.executor.socket_path, error)
        remember_agent_user(None)
        return
    remember_agent_user(identity["user"], identity.get("confinement"))
    logger.info(
        "tools run in the executor (pid %s) as OS user %s (uid %s), workspace %s",
        identity["pid"], identity["user"], identity["uid"], identity["root"],
    )  # fmt: skip
    detail = protections(identity.get("confinement"))
    logger.info(
        "kernel confinement: %s; full-scope credentials default to profile '%s'",
        detail.get("summary", "unknown"), detail["default_profile"],
    )  # fmt: skip
    if services.executor_child is not None and detail["default_profile"] == HOST:
        why = "SANDSTORM_CONFINEMENT=host" if settings.CONFINEMENT_DEFAULT == HOST else detail.get("workspace")
        logger.warning(
            "development mode: tools run unconfined (%s) as OS user %s, the server's own user, so an agent can read "
            "the server's database and keys (see README, Security model); production runs them as the agent user",
            why, identity["user"],
        )  # fmt: skip
    if identity["root"] != os.path.realpath(services.executor.root):
        logger.warning(
            "the executor's workspace %s is not SANDSTORM_WORKSPACE_ROOT %s", identity["root"], services.executor.root
        )


@dataclass(frozen=True)
class McpApplication:
    asgi: ASGIApp  # what serves /mcp
    runner: SessionManagerRunner  # to start and stop with the server (mcpserver.lifespan)
    services: Services


def build_mcp_application(services: Services | None = None) -> McpApplication:
    """Build /mcp from the current settings (with `services`, or ones built from the settings), and register its
    services for /health and the revocation receiver."""
    install_transport()  # JSON answers where no stream is needed (mcpserver.transport)
    if services is None:
        services = build_services()
    server = build_server(sandstorm_version(), services)
    server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=transport_security(),
        max_request_body_size=settings.MAX_REQUEST_BYTES,
    )
    failures = FailureAggregator()
    housekeeping = Housekeeping(failures, services.audit_budget)
    watcher = RevocationWatcher(IN_FLIGHT, services.executor)
    job_recorder = JobRecorder(lambda: services.executor)
    bus = WorkerBus(on_revocation=watcher.wake_threadsafe, sessions=services.sessions)
    if isinstance(services.sessions, SharedSessionLedger):
        services.sessions.ask_others = ask_workers_to_end_idle_session

    async def start() -> None:
        await housekeeping.start()
        await sync_to_async(cancel_orphaned, thread_sensitive=False)(INSTANCE_ID)
        await announce_executor(services)
        await watcher.start()
        await job_recorder.start()
        await bus.start()

    async def stop() -> None:
        await bus.stop()
        await watcher.stop()
        await job_recorder.stop()
        await stop_waiting()  # held approval requests end as cancelled: nobody would be left to run them
        await asyncio.to_thread(audit_log.close)  # every session has ended: write what is queued
        await housekeeping.stop()
        if services.executor_child is not None:
            await asyncio.to_thread(services.executor_child.stop)

    async def before_stop() -> None:
        await services.stop.stop(IN_FLIGHT)

    runner = SessionManagerRunner(server.session_manager, on_start=start, on_stop=stop, before_stop=before_stop)
    authenticator = build_authenticator()
    endpoint = McpEndpoint(runner, services.sessions)
    step_up = StepUpGate(endpoint, services=services, resource_metadata_url=resource_metadata_url())
    app = BearerAuthMiddleware(
        JsonBodyGate(step_up, max_body_bytes=settings.MAX_REQUEST_BYTES),
        authenticate=authenticator,
        rate_limiter=services.rate_limiter,
        resource_metadata_url=resource_metadata_url(),
        failures=failures,
    )
    register(services)
    gated = StopGate(HostOriginCheck(app, public_url=settings.PUBLIC_URL), services.stop)
    guarded = JsonErrors(gated, services.database)
    return McpApplication(guarded, runner, services)
