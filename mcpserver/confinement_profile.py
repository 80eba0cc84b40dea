"""The confinement profile a call's processes start in, from its credential (mcpserver.executor.confinement).

A read-only credential's processes always start in `read`. A full-scope credential has its own choice, or the
installation's default (settings.CONFINEMENT_DEFAULT). Where the executor's kernel cannot enforce `workspace`, a
credential or installation that chose it has its calls refused by the executor; the development default, which
nobody chose, falls back to `host` (and the banner, the log and /health say so).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from mcpserver.executor.confinement import READ, WORKSPACE, summary
from oauth.confinement import installation_default
from oauth.credentials import Principal


def default_profile() -> str:
    """The installation's default as it applies now (oauth.confinement, which the console shows too)."""
    return installation_default()


def profile_of(principal: Principal) -> str:
    if principal.read_only:
        return READ
    return principal.confinement or default_profile()


def protections(described: dict[str, Any] | None) -> dict[str, Any]:
    """Which protections are in force, for /health and the console's status home: the kernel's sandbox per
    profile ("enforced" or why not) and the default profile of full-scope credentials as it applies now."""
    if described is None:
        return {"known": False, "default_profile": settings.CONFINEMENT_DEFAULT}
    profiles = described.get("profiles")
    return {
        "known": True,
        "landlock_abi": described.get("landlock_abi"),
        "read": profiles.get(READ, "unknown") if isinstance(profiles, dict) else "unknown",
        "workspace": profiles.get(WORKSPACE, "unknown") if isinstance(profiles, dict) else "unknown",
        "default_profile": default_profile(),
        # Whether revoking a credential also ends what its commands left running outside a background job.
        "process_groups": described.get("process_groups", "unknown"),
        "summary": summary(described),
    }
