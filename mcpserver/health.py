"""/health: is the server up, and what does the host have left. No authentication, nothing secret."""

from __future__ import annotations

import logging
import os
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from audit import recordings
from audit.log.held import held
from mcpserver.confinement_profile import protections
from mcpserver.executor.interface import ExecutorError
from mcpserver.process import sandstorm_version, uptime_seconds
from mcpserver.registry import TOOLS
from mcpserver.services import Services, running_services
from mcpserver.tools import ALL_TOOL_MODULES  # noqa: F401  (importing registers the tools)
from oauth.agent_identity import remember_agent_user

logger = logging.getLogger(__name__)


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def executor_status(services: Services) -> dict[str, Any]:
    """Whether the tool executor answers, and as whom it runs the tools (over a kept connection, as tool calls)."""
    try:
        identity = await services.executor.identity()
    except ExecutorError as error:
        logger.error("health: the tool executor does not answer on %s: %s", services.executor.socket_path, error)
        remember_agent_user(None)
        return {"ok": False, "error": "the tool executor does not answer; tool calls fail until it is back"}
    remember_agent_user(identity["user"], identity.get("confinement"))
    return {
        "ok": True,
        "mode": "child" if services.executor_child is not None else "service",
        "user": identity["user"],
        "workspace_disk_free_bytes": identity.get("disk_free"),
        # The kernel's sandbox under tool processes (docs/security.md, Kernel confinement).
        "confinement": protections(identity.get("confinement")),
    }


async def redis_error(services: Services) -> str | None:
    """Why the Redis the workers share does not answer, or None (also where there is none)."""
    if services.redis is None:
        return None
    try:
        await services.redis.ping()
    except RedisError as error:
        logger.error("health: Redis does not answer: %s", error)
        return "Redis does not answer; requests are refused until it is back"
    return None


@require_GET
async def health(request: HttpRequest) -> JsonResponse:
    """200 when the server can run tools; 503 when the executor does not answer, the audit log is full, the
    database cannot be read, finished records wait to be written, or the workers' Redis does not answer (calls fail
    until it is back, until an admin makes room, or until it is restored).

    Async: no thread hop, and the executor is asked over the same kept connections tool calls use. The services are
    those of the /mcp application built in this process (mcpserver.application).
    """
    services = running_services()
    executor = await executor_status(services)
    budget = await services.audit_budget.state()  # a cached measure: no query on most requests
    audit_full = budget is not None and budget.full
    database_error = await services.database.error()  # a cached verdict: no query on most requests
    shared_error = await redis_error(services)
    unwritten = held().problem()  # finished records the database refused, not yet written
    ok = executor["ok"] and not audit_full and database_error is None and shared_error is None and unwritten is None
    return JsonResponse(
        {
            "ok": ok,
            "executor": executor,
            "database": {"ok": True} if database_error is None else {"ok": False, "error": database_error},
            # The audit log's size against SANDSTORM_AUDIT_MAX_BYTES (null: no budget); full: tool calls are refused.
            "audit_log": budget.as_json() if budget is not None else None,
            # What calls printed, kept whole (audit/recordings.py): full means new calls go unrecorded, never refused;
            # "on": false, that recording is off (SANDSTORM_RECORDING_MAX_BYTES=0).
            "recordings": {"on": recordings.enabled(), **recordings.state()},
            # Finished records the database refused, held until it takes them (audit/log/held.py).
            "audit_records_held": None if unwritten is None else {"count": held().count, "error": unwritten},
            # Several workers (docs/scaling.md): which one answered, and whether the Redis they share answers.
            "worker": settings.WORKER,
            "redis": None if services.redis is None else {"ok": shared_error is None, "error": shared_error},
            "version": sandstorm_version(),
            "uptime_seconds": round(uptime_seconds(), 1),
            "cores": os.cpu_count(),
            "memory_available_bytes": available_memory_bytes(),
            # Read by the executor: in production the server's user cannot see into the agent's workspace.
            "workspace_disk_free_bytes": executor.get("workspace_disk_free_bytes"),
            "tools": sorted(TOOLS),
        },
        status=200 if ok else 503,
    )
