"""The objects one server process shares across requests, built from settings when its application is built.

The ASGI application factory (mcpserver.application) builds them once and passes them to what needs them; it also
registers them here, for what runs outside the /mcp application and has nothing to be passed in by (the /health
view, the revocation receiver). Building another application, after `override_settings` say, builds new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.asyncio import Redis

from audit.budget import AuditBudget
from mcpserver.database_health import DatabaseHealth
from mcpserver.executor.child import ExecutorChild
from mcpserver.executor.remote import RemoteExecutor
from mcpserver.limits import CallLimit, ConcurrencyLimiter, RateLimiter, RequestLimit
from mcpserver.sessions import SessionLedger
from mcpserver.shared_limits import SharedConcurrencyLimiter, SharedRateLimiter, SharedSessionLedger, connect
from mcpserver.stopping import ServerStop


@dataclass
class Services:
    executor: RemoteExecutor
    # The executor this process started itself (development), or None when it is a separate service (production).
    executor_child: ExecutorChild | None
    rate_limiter: RequestLimit
    concurrency: CallLimit
    result_cap: int
    audit_budget: AuditBudget
    sessions: SessionLedger
    # Whether the database answers what /mcp needs (for /health; the /mcp error layer marks it failed at once).
    database: DatabaseHealth
    # Where several workers count their limits together (SANDSTORM_REDIS_URL), for /health; None: this process alone.
    redis: Redis | None = None
    # Set when /mcp stops: new requests are refused, running calls answer that the server is stopping.
    stop: ServerStop = field(default_factory=ServerStop)


def build_executor() -> tuple[RemoteExecutor, ExecutorChild | None]:
    """The client to the executor the settings name: production's service, or in development a child of our own
    (started on first use; the caller stops it)."""
    root = str(settings.WORKSPACE_ROOT)
    if settings.EXECUTOR_SOCKET:
        return RemoteExecutor(settings.EXECUTOR_SOCKET, root), None
    limits = (
        "--max-processes", str(settings.TOOL_MAX_PROCESSES),
        "--max-memory", str(settings.TOOL_MAX_MEMORY),
        "--output-max-bytes", str(settings.OUTPUT_MAX_BYTES),
        # Saved output and background logs: the executor's, in the state dir, where no tool and no confined command
        # reaches (never the workspace: every credential's tools reach that).
        "--output-dir", str(settings.STATE_DIR / "output"),
        # What a workspace-confined command may neither read nor write: the state dir (database, keys, spill
        # files) and the project checkout the server runs from (its code, its .env); the workspace stays open.
        "--hide", str(settings.STATE_DIR), "--hide", str(settings.BASE_DIR),
        "--kernel-confinement", settings.KERNEL_CONFINEMENT,
    )  # fmt: skip
    child = ExecutorChild(root, settings.TOOL_ENV_ALLOW, limits)
    return child.remote(), child


def build_limits(redis: Redis | None) -> tuple[RequestLimit, CallLimit]:
    """The per-credential limits: in this process's memory, or in Redis where several workers count together."""
    if redis is not None:
        prefix = settings.REDIS_PREFIX
        return (
            SharedRateLimiter(redis, prefix, settings.RATE_LIMIT_PER_MINUTE),
            SharedConcurrencyLimiter(redis, prefix, settings.MAX_CONCURRENT_CALLS),
        )
    return RateLimiter(settings.RATE_LIMIT_PER_MINUTE), ConcurrencyLimiter(settings.MAX_CONCURRENT_CALLS)


def build_session_ledger(redis: Redis | None) -> SessionLedger:
    caps = {
        "per_credential": settings.MAX_SESSIONS_PER_CREDENTIAL,
        "per_user": settings.MAX_SESSIONS_PER_USER,
        "unused_timeout": settings.SESSION_UNUSED_TIMEOUT,
    }
    if redis is not None:
        return SharedSessionLedger(redis, settings.REDIS_PREFIX, **caps)
    return SessionLedger(**caps)


def build_services() -> Services:
    executor, child = build_executor()
    redis = connect(settings.REDIS_URL) if settings.REDIS_URL else None
    rate_limiter, concurrency = build_limits(redis)
    return Services(
        executor=executor,
        executor_child=child,
        rate_limiter=rate_limiter,
        concurrency=concurrency,
        result_cap=settings.RESULT_CAP_BYTES,
        audit_budget=AuditBudget(settings.AUDIT_MAX_BYTES),
        sessions=build_session_ledger(redis),
        database=DatabaseHealth(),
        redis=redis,
    )


_registered: Services | None = None


def register(services: Services) -> None:
    """Make these the services of the application this process serves (the last one built)."""
    global _registered
    _registered = services


def registered() -> Services | None:
    """The services of the application built in this process, or None if none was (a management command)."""
    return _registered


def running_services() -> Services:
    """The services of the application built in this process; for code that only runs beside it."""
    if _registered is None:
        raise ImproperlyConfigured(
            "no MCP application was built in this process: serve the site through sandstorm_site.asgi (Daphne), "
            "whose mcpserver.application.build_mcp_application builds the executor client, limits and audit budget"
        )
    return _registered
