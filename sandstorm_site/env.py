"""Typed readers for environment variables.

Each helper raises ImproperlyConfigured naming the variable, so a bad value stops start-up with one line
that says what to fix. Only settings.py calls these.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from oauth.authority import parse_authority


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise ImproperlyConfigured(f"{name} must be at least {minimum}{upper}, not {value}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be 1/0, true/false, yes/no or on/off, not {raw!r}")


def env_path(name: str, default: str, base: Path, *, visible: bool = True) -> Path:
    """An absolute path; relative values are taken relative to `base`. Its parent must exist, unless the path
    belongs to another OS user (`visible=False`: this process may not be allowed to look)."""
    path = Path(env_str(name, default)).expanduser()
    if not path.is_absolute():
        path = base / path
    path = Path(os.path.normpath(path))
    if not visible:
        return path
    if not path.parent.is_dir():
        raise ImproperlyConfigured(f"{name}: the parent directory {path.parent} does not exist")
    if path.exists() and not path.is_dir():
        raise ImproperlyConfigured(f"{name}: {path} exists and is not a directory")
    return path


def env_url(name: str, default: str) -> str:
    """An http(s) origin without a trailing slash, path, query or credentials."""
    value = env_str(name, default).rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ImproperlyConfigured(f"{name} must be an http:// or https:// URL, not {value!r}")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ImproperlyConfigured(f"{name} must be an origin such as https://mcp.example.com, not {value!r}")
    try:
        parts.port  # noqa: B018 - reading it raises ValueError on a port out of range or not a number
    except ValueError:
        raise ImproperlyConfigured(f"{name} has an invalid port: {value!r}") from None
    if parse_authority(parts.netloc) is None:
        # The parser /mcp's Host and Origin checks and the redirect URI policy use, so they can compare with it.
        raise ImproperlyConfigured(
            f"{name} must name its host plainly (an ASCII DNS name, an IPv4 address or a bracketed IPv6 address): {value!r}"
        )
    return value


def env_redis_url(name: str) -> str:
    """A Redis URL (redis://, rediss:// or unix:///path/redis.sock), or "" when unset."""
    value = env_str(name, "")
    if not value:
        return ""
    parts = urlsplit(value)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(
            f"{name} must be a redis://, rediss:// or unix:// URL, not one with scheme {parts.scheme!r}"
        )
    if parts.scheme == "unix" and not parts.path:
        raise ImproperlyConfigured(f"{name} must name the socket: unix:///run/redis/redis-server.sock")
    if parts.scheme != "unix" and not parts.hostname:
        raise ImproperlyConfigured(f"{name} must name the host: redis://127.0.0.1:6379/0")
    try:
        parts.port  # noqa: B018 - reading it raises ValueError on a port out of range or not a number
    except ValueError:
        raise ImproperlyConfigured(f"{name} has an invalid port") from None
    return value


def env_secret(name: str, generated_file: Path) -> str:
    """A secret from NAME, from the file named by NAME_FILE, or generated once into `generated_file` (0600)."""
    value = os.environ.get(name, "").strip()
    if value:
        return value
    file_name = os.environ.get(f"{name}_FILE", "").strip()
    if file_name:
        try:
            value = Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_name}: {exc.strerror}") from None
        if not value:
            raise ImproperlyConfigured(f"{name}_FILE: {file_name} is empty")
        return value
    return read_or_create_secret_file(generated_file, name)


def read_or_create_secret_file(path: Path, name: str) -> str:
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}: cannot read {path}: {exc.strerror}") from None
    if value:
        return value
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    value = secrets.token_urlsafe(50)
    # O_EXCL: if two processes start at once, one creates the file and the other reads it.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value
