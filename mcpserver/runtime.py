"""The objects one server process shares across requests, built once from settings."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache

from django.conf import settings

from audit.budget import AuditBudget
from mcpserver.executor.child import ExecutorChild
from mcpserver.executor.remote import RemoteExecutor
from mcpserver.limits import ConcurrencyLimiter, RateLimiter

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    executor: RemoteExecutor
    # The executor this process started itself (development), or None when it is a separate service (production).
    executor_child: ExecutorChild | None
    rate_limiter: RateLimiter
    concurrency: ConcurrencyLimiter
    result_cap: int
    audit_budget: AuditBudget


def build_executor() -> tuple[RemoteExecutor, ExecutorChild | None]:
    root = str(settings.WORKSPACE_ROOT)
    if settings.EXECUTOR_SOCKET:
        return RemoteExecutor(settings.EXECUTOR_SOCKET, root), None
    limits = (
        "--max-processes", str(settings.TOOL_MAX_PROCESSES),
        "--max-memory", str(settings.TOOL_MAX_MEMORY),
        "--output-max-bytes", str(settings.OUTPUT_MAX_BYTES),
    )  # fmt: skip
    child = ExecutorChild(root, settings.TOOL_ENV_ALLOW, limits)
    return child.remote(), child


@cache
def get_runtime() -> Runtime:
    executor, child = build_executor()
    return Runtime(
        executor=executor,
        executor_child=child,
        rate_limiter=RateLimiter(settings.RATE_LIMIT_PER_MINUTE),
        concurrency=ConcurrencyLimiter(settings.MAX_CONCURRENT_CALLS),
        result_cap=settings.RESULT_CAP_BYTES,
        audit_budget=AuditBudget(settings.AUDIT_MAX_BYTES),
    )

