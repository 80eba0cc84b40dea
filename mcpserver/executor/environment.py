"""The clean environment tool processes run with: never the server's own (no token, key or setting leaks)."""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Names an admin may not pass through even on purpose: they configure or authenticate the server itself.
NEVER_PASSED = ("SANDSTORM_", "DJANGO_", "DATABASE_URL")


def _server_bin_dirs() -> set[str]:
    return {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}


def tool_path(server_path: str | None) -> str:
    """The server's PATH without the server's own virtualenv, so `python` is not the server's interpreter."""
    hidden = _server_bin_dirs()
    kept = [entry for entry in (server_path or DEFAULT_PATH).split(":") if entry and entry not in hidden]
    return ":".join(kept) or DEFAULT_PATH


def clean_environment(allow: Iterable[str] = (), source: Mapping[str, str] | None = None) -> dict[str, str]:
    """PATH, HOME, LANG, USER, LOGNAME, SHELL and TERM for the current OS user, plus the allowed names."""
    source = os.environ if source is None else source
    account = pwd.getpwuid(os.getuid())
    env = {
        "PATH": tool_path(source.get("PATH")),
        "HOME": account.pw_dir,
        "USER": account.pw_name,
        "LOGNAME": account.pw_name,
        "SHELL": "/bin/bash",
        "LANG": source.get("LANG") or "C.UTF-8",
        "TERM": "dumb",
    }
    for name in allow:
        if name in source and not name.startswith(NEVER_PASSED):
            env[name] = source[name]
    return env
