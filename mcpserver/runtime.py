"""The objects one server process shares across requests, built once from settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.conf import settings

from mcpserver.executor.interface import Executor
from mcpserver.executor.local import LocalExecutor
from mcpserver.limits import ConcurrencyLimiter, RateLimiter


@dataclass
class Runtime:
    executor: Executor
    rate_limiter: RateLimiter
    concurrency: ConcurrencyLimiter
    result_cap: int


@cache
def get_runtime() -> Runtime:
    return Runtime(
        executor=LocalExecutor(str(settings.WORKSPACE_ROOT), settings.TOOL_ENV_ALLOW),
        rate_limiter=RateLimiter(settings.RATE_LIMIT_PER_MINUTE),
        concurrency=ConcurrencyLimiter(settings.MAX_CONCURRENT_CALLS),
        result_cap=settings.RESULT_CAP_BYTES,
    )
