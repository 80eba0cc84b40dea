"""/health: is the server up, and what does the host have left. No authentication, nothing secret."""

from __future__ import annotations

import os
import shutil

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from mcpserver.instance import sandstorm_version, uptime_seconds
from mcpserver.registry import TOOLS
from mcpserver.tools import ALL_TOOL_MODULES  # noqa: F401  (importing registers the tools)


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    disk = shutil.disk_usage(settings.WORKSPACE_ROOT) if os.path.isdir(settings.WORKSPACE_ROOT) else None
    return JsonResponse(
        {
            "ok": True,
            "version": sandstorm_version(),
            "uptime_seconds": round(uptime_seconds(), 1),
            "cores": os.cpu_count(),
            "memory_available_bytes": available_memory_bytes(),
            "workspace_disk_free_bytes": disk.free if disk else None,
            "tools": sorted(TOOLS),
        }
    )
