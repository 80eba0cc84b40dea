"""Django settings. Every environment variable Sandstorm reads is read here, and only here."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from mcpserver.executor.rlimits import DEFAULT_MAX_PROCESSES, MIN_MAX_MEMORY, default_max_memory
from mcpserver.executor.savedoutput import DEFAULT_MAX_BYTES as DEFAULT_OUTPUT_MAX_BYTES
from sandstorm_site.env import (
    env_bool,
    env_int,
    env_path,
    env_redis_url,
    env_secret,
    env_str,
    env_url,
    read_or_create_secret_file,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# --- where things live -------------------------------------------------------------------------------------------
MCP_HOST = env_str("SANDSTORM_MCP_HOST", "127.0.0.1")
MCP_PORT = env_int("SANDSTORM_MCP_PORT", 8080, minimum=1, maximum=65535)
_default_host = f"[{MCP_HOST}]" if ":" in MCP_HOST else MCP_HOST
PUBLIC_URL = env_url("SANDSTORM_PUBLIC_URL", f"http://{_default_host}:{MCP_PORT}")
MCP_RESOURCE_URL = f"{PUBLIC_URL}/mcp"
# The executor's Unix socket. Production: the executor runs under its own unit as the agent user and listens here.
# Unset (development): the server starts the executor as its own child, under the server's OS user.
EXECUTOR_SOCKET = env_str("SANDSTORM_EXECUTOR_SOCKET", "")
# With a separate executor the workspace is the agent user's, which the server may not even be able to see.
WORKSPACE_ROOT = env_path("SANDSTORM_WORKSPACE_ROOT", "./workspace", BASE_DIR, visible=not EXECUTOR_SOCKET)
STATE_DIR = env_path("SANDSTORM_STATE_DIR", "./var", BASE_DIR)


def _is_within(path: Path, root: Path) -> bool:
    real_path, real_root = os.path.realpath(path), os.path.realpath(root)
    return real_path == real_root or real_path.startswith(real_root.rstrip("/") + "/")


if _is_within(STATE_DIR, WORKSPACE_ROOT):
    raise ImproperlyConfigured(
        f"SANDSTORM_STATE_DIR ({STATE_DIR}) must not be inside SANDSTORM_WORKSPACE_ROOT ({WORKSPACE_ROOT})"
    )
STATE_DIR.mkdir(mode=0o700, exist_ok=True)

SECRET_KEY = env_secret("SANDSTORM_SECRET_KEY", STATE_DIR / "secret_key")
# Key of the audit log's hash chain: in the state dir (never the workspace), generated once, 0600.
AUDIT_HMAC_KEY = read_or_create_secret_file(STATE_DIR / "audit_key", "audit key").encode("utf-8")
# The chain head, appended every minute with an HMAC (audit/anchor.py): deleting the newest records shows.
AUDIT_ANCHOR_FILE = STATE_DIR / "audit_anchors"
DEBUG = env_bool("SANDSTORM_DEBUG", False)

# --- tokens and limits -------------------------------------------------------------------------------------------
MCP_BOOTSTRAP_TOKEN = os.environ.get("SANDSTORM_MCP_TOKEN", "").strip()
ADMIN_PASSWORD = os.environ.get("SANDSTORM_ADMIN_PASSWORD", "")
RATE_LIMIT_PER_MINUTE = env_int("SANDSTORM_RATE_LIMIT", 600)
MAX_CONCURRENT_CALLS = env_int("SANDSTORM_MAX_CONCURRENT_CALLS", 16, minimum=1)
RESULT_CAP_BYTES = env_int("SANDSTORM_RESULT_CAP", 262144, minimum=4096, maximum=900_000)
MAX_REQUEST_BYTES = env_int("SANDSTORM_MAX_REQUEST_BYTES", 4194304, minimum=65536)
# Open MCP sessions (2025-11-25) per credential and per user, in each server process; a credential at its cap loses
# its own oldest idle session to a new one. A session that makes no request beyond the handshake is closed after
# SANDSTORM_SESSION_UNUSED_TIMEOUT seconds (any session after 30 idle minutes, the SDK's default).
MAX_SESSIONS_PER_CREDENTIAL = env_int("SANDSTORM_MAX_SESSIONS_PER_CREDENTIAL", 16, minimum=1)
MAX_SESSIONS_PER_USER = env_int("SANDSTORM_MAX_SESSIONS_PER_USER", 256, minimum=1)
SESSION_UNUSED_TIMEOUT = env_int("SANDSTORM_SESSION_UNUSED_TIMEOUT", 60, minimum=1)
AUDIT_EXCERPT_BYTES = env_int("SANDSTORM_AUDIT_EXCERPT", 8192, minimum=256)
# Read-only tools run first and have both their records committed together after the read, before the result
# leaves (a read changes nothing). On: a read's started record is committed before it runs, as every other call's.
AUDIT_READS_BEFORE = env_bool("SANDSTORM_AUDIT_READS_BEFORE", False)
# Disk budget of the audit log (bytes; 0 = none): at it, tool calls are refused until an admin prunes or raises it.
AUDIT_MAX_BYTES = env_int("SANDSTORM_AUDIT_MAX_BYTES", 10 * 1024**3)
# Recordings of what calls printed, whole and with their timing (audit/recordings.py), in the state dir, never the
# workspace: at most RECORDING_MAX_BYTES of output per call (past it, its head and tail; 0 turns recording off, for
# privacy or a host whose disk matters), and RECORDINGS_MAX_BYTES (compressed; 0 = none) in all. A full budget never
# fails a call: it is recorded as unrecorded.
RECORDINGS_DIR = STATE_DIR / "recordings"
RECORDING_MAX_BYTES = env_int("SANDSTORM_RECORDING_MAX_BYTES", 16 * 1024**2)
if 0 < RECORDING_MAX_BYTES < 4096:
    raise ImproperlyConfigured(
        f"SANDSTORM_RECORDING_MAX_BYTES must be 0 (off) or at least 4096, not {RECORDING_MAX_BYTES}"
    )
RECORDINGS_MAX_BYTES = env_int("SANDSTORM_RECORDINGS_MAX_BYTES", 5 * 1024**3)
# Start even though the start-up check finds lost audit records or a damaged or missing database (for one start: the
# loss is recorded in the audit log and the chain anchored anew; mcpserver/start_check.py).
ACCEPT_AUDIT_LOSS = env_bool("SANDSTORM_ACCEPT_AUDIT_LOSS", False)
ACCESS_TOKEN_TTL = env_int("SANDSTORM_ACCESS_TOKEN_TTL", 3600, minimum=60)
# Anonymous dynamic client registrations per client address per hour; 0 turns the limit off.
REGISTRATION_RATE_LIMIT = env_int("SANDSTORM_REGISTRATION_RATE_LIMIT", 20)
# Staff sign-in: a second factor (TOTP, recovery codes) is required of every staff user who set one up; with this
# on, of every staff user, who must set one up before anything else (oauth/second_factor.py).
REQUIRE_SECOND_FACTOR = env_bool("SANDSTORM_REQUIRE_SECOND_FACTOR", False)
# Client ID metadata documents (a client_id that is an https URL, fetched by this server: needs outbound HTTPS).
# Off: not advertised, and clients register dynamically instead.
CLIENT_METADATA_DOCUMENTS = env_bool("SANDSTORM_CLIENT_METADATA_DOCUMENTS", True)
# Variables a tool process may see beyond the fixed clean set (comma-separated names).
TOOL_ENV_ALLOW = tuple(name for name in env_str("SANDSTORM_TOOL_ENV_ALLOW", "").split(",") if name.strip())
# Limits of tool processes, applied by the executor (development: passed to the one the server starts; production:
# read by the executor from its own env file). 0 turns each off.
TOOL_MAX_PROCESSES = env_int("SANDSTORM_TOOL_MAX_PROCESSES", DEFAULT_MAX_PROCESSES)
TOOL_MAX_MEMORY = env_int("SANDSTORM_TOOL_MAX_MEMORY", default_max_memory())
if 0 < TOOL_MAX_MEMORY < MIN_MAX_MEMORY:
    raise ImproperlyConfigured(
        f"SANDSTORM_TOOL_MAX_MEMORY must be 0 (off) or at least {MIN_MAX_MEMORY}, not {TOOL_MAX_MEMORY}"
    )
OUTPUT_MAX_BYTES = env_int("SANDSTORM_OUTPUT_MAX_BYTES", DEFAULT_OUTPUT_MAX_BYTES)
# The confinement profile of full-scope credentials that leave it to the installation (oauth/confinement.py):
# "workspace" (kernel-enforced: writes only in the workspace and a private temporary directory; the server's state,
# keys and code out of reach) or "host" (the agent user's full reach). Unset: "workspace" in development, so an agent
# cannot read the server's keys or edit its code; "host" in production (the executor's socket set), as installed.
_confinement = env_str("SANDSTORM_CONFINEMENT", "").lower()
if _confinement not in {"", "workspace", "host"}:
    raise ImproperlyConfigured(f"SANDSTORM_CONFINEMENT must be workspace or host, not {_confinement!r}")
CONFINEMENT_DEFAULT = _confinement or ("host" if EXECUTOR_SOCKET else "workspace")
# Set by the admin: where the kernel cannot enforce it, calls are refused; the unset development default falls back.
CONFINEMENT_DEFAULT_CHOSEN = bool(_confinement)
# "off": no kernel sandbox (Landlock) under tool processes, for a kernel that misbehaves with it; read tools then
# rely on the git layer's defences alone and `workspace` credentials are refused. Development passes it to the
# executor child; production's executor reads it from its own environment file.
KERNEL_CONFINEMENT = env_str("SANDSTORM_KERNEL_CONFINEMENT", "auto").lower()
if KERNEL_CONFINEMENT not in {"auto", "off"}:
    raise ImproperlyConfigured(f"SANDSTORM_KERNEL_CONFINEMENT must be auto or off, not {KERNEL_CONFINEMENT!r}")
# Approval of calls a policy rule asks about (mcpserver/approvals): no answer in APPROVAL_TIMEOUT seconds is a
# denial; a call still waiting at APPROVAL_HOLD seconds answers "pending" (clients cut calls short near 60 s).
APPROVAL_TIMEOUT = env_int("SANDSTORM_APPROVAL_TIMEOUT", 300, minimum=5, maximum=86400)
APPROVAL_HOLD = env_int("SANDSTORM_APPROVAL_HOLD", 45, minimum=1, maximum=3600)
APPROVAL_WEBHOOK_URL = env_str("SANDSTORM_APPROVAL_WEBHOOK_URL", "")
APPROVAL_WEBHOOK_SECRET = os.environ.get("SANDSTORM_APPROVAL_WEBHOOK_SECRET", "")
APPROVAL_EMAIL = tuple(a.strip() for a in env_str("SANDSTORM_APPROVAL_EMAIL", "").split(",") if a.strip())

# --- hosts -------------------------------------------------------------------------------------------------------
_public = urlsplit(PUBLIC_URL)
PUBLIC_HOST = _public.hostname or "localhost"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
ALLOWED_HOSTS = sorted({PUBLIC_HOST, *LOOPBACK_HOSTS, "::1"})
CSRF_TRUSTED_ORIGINS = [PUBLIC_URL]
USE_X_FORWARDED_HOST = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if _public.scheme == "https" else None
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _public.scheme == "https"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# --- Django ------------------------------------------------------------------------------------------------------
INSTALLED_APPS = [
    "daphne",
    "sandstorm_site.apps.SandstormAdminConfig",  # django.contrib.admin with our site class
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "oauth2_provider",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "audit",
    "oauth",
    "mcpserver",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "sandstorm_site.nul.refuse_nul_characters",
    "sandstorm_site.visible_html.visible_control_characters",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",  # request.user.is_verified(): the second factor of this session
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "sandstorm_site.urls"
ASGI_APPLICATION = "sandstorm_site.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_from_url(url: str) -> dict[str, object]:
    """postgres://user:password@host:port/name?option=value: options (sslmode, connect_timeout, host=/run/postgresql
    for a Unix socket, ...) go to libpq as they are."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgres:// URL, not one with scheme {parts.scheme!r}")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL must name the database: postgres://user:password@host:port/NAME")
    try:
        port = str(parts.port or "")
    except ValueError as error:
        raise ImproperlyConfigured(f"DATABASE_URL has a bad port ({error})") from None
    return {
        # Django's backend, with connections that recover after PostgreSQL dropped them (a restart).
        "ENGINE": "sandstorm_site.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(parts.hostname or ""),
        "PORT": port,
        "OPTIONS": dict(parse_qsl(parts.query)),
        "CONN_MAX_AGE": 60,
        # One per test process, so two test runs against one server never share it (pytest-django creates it).
        "TEST": {"NAME": f"test_{name}_{os.getpid()}"},
    }


_database_url = os.environ.get("DATABASE_URL", "").strip()
DATABASES = {
    "default": _database_from_url(_database_url)
    if _database_url
    else {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": STATE_DIR / "sandstorm.sqlite3",
        "OPTIONS": {
            # WAL lets readers run beside the writer; IMMEDIATE takes the write lock at BEGIN, so concurrent
            # read-then-write transactions wait for each other instead of failing with "database is locked".
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, not the in-memory default: code under test reads the database from worker threads too. One per
        # test process, so two test runs at once never share it.
        "TEST": {"NAME": STATE_DIR / f"test-{os.getpid()}.sqlite3"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "admin:login"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# One date format in the console, naming the zone ("2026-12-07 15:04:05 UTC"): sandstorm_site/formats.
FORMAT_MODULE_PATH = ["sandstorm_site.formats"]
STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"

# One JSON object per line on stdout (journald in production); "text" is easier to read in a terminal.
LOG_FORMAT = env_str("SANDSTORM_LOG_FORMAT", "json").lower()
if LOG_FORMAT not in {"json", "text"}:
    raise ImproperlyConfigured(f"SANDSTORM_LOG_FORMAT must be json or text, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "mcpserver.executor.jsonlog.JsonFormatter"},
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django": {"level": "INFO"},
        # The SDK logs every session it opens at INFO; keep the server log about what matters.
        "mcp": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}

# --- second factor (django-otp) ---------------------------------------------------------------------------------
# The name authenticator apps show next to the code (the public host, so two servers are told apart).
OTP_TOTP_ISSUER = f"Sandstorm {PUBLIC_HOST}"
# Each wrong code doubles the wait before the device checks another (1 s, 2 s, 4 s, ...): on, explicitly.
OTP_TOTP_THROTTLE_FACTOR = 1
OTP_STATIC_THROTTLE_FACTOR = 1
# The device pages of the admin never show a TOTP key or a recovery code.
OTP_ADMIN_HIDE_SENSITIVE_DATA = True

# --- OAuth (django-oauth-toolkit) ----------------------------------------------------------------------------------
# The toolkit's own models (named so that migrations referring to them resolve; they are not swapped).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
# Every default of the toolkit that is not safe for an MCP server is overridden here, on purpose, and
# tests/test_oauth_settings.py asserts each value. Policy the toolkit lacks lives in oauth/policy.py.
OAUTH2_PROVIDER = {
    "OAUTH2_VALIDATOR_CLASS": "oauth.policy.SandstormValidator",
    # Scopes: `mcp` allows every tool, `mcp:read` the read-only ones. A client asking for none gets `mcp`.
    "SCOPES": {"mcp": "every tool", "mcp:read": "read-only tools"},
    "DEFAULT_SCOPES": ["mcp"],
    # Only the authorization-code flow (with refresh), advertised as such.
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_post", "client_secret_basic"],
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    # PKCE for every client, S256 only: `plain` and a missing challenge are refused.
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_PKCE_REQUIRED": True,
    # RFC 9207 `iss` in every authorization response, equal byte for byte to the metadata's issuer.
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "OIDC_ENABLED": False,
    "OIDC_ISS_ENDPOINT": PUBLIC_URL,
    # Tokens at rest: only a SHA-256 checksum, never the token; access tokens are bearer-header only.
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    # Lifetimes: short access tokens, codes good for one exchange within 60 s, refresh tokens rotated on every
    # use with reuse protection (replaying an old one revokes its whole family; no grace period), and dropped
    # after 30 days without use.
    "ACCESS_TOKEN_EXPIRE_SECONDS": ACCESS_TOKEN_TTL,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": 0,
    "REFRESH_TOKEN_EXPIRE_SECONDS": 30 * 24 * 3600,
    # Redirect URIs: exact match, no wildcards; `http` is kept only for loopback (Claude Code), which
    # oauth/policy.py enforces. A loopback redirect (127.0.0.1, [::1], localhost) matches on any port.
    "ALLOWED_REDIRECT_URI_SCHEMES": ["https", "http"],
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_SCHEME": False,  # an Error under check --deploy while http is listed
    "ALLOW_URI_WILDCARDS": False,
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_MATCHING": True,
    "ALLOW_LOCALHOST_LOOPBACK": True,
    # Every consent is shown: never skipped because an earlier token exists.
    "REQUEST_APPROVAL_PROMPT": "force",
    # Dynamic client registration is open (Claude.ai registers anonymously) but rate-limited per address and
    # limited to authorization_code + refresh_token by oauth/views/registration.py.
    "DCR_ENABLED": True,
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "DCR_REGISTRATION_TOKEN_EXPIRE_SECONDS": 30 * 24 * 3600,
    # Client ID metadata documents (SANDSTORM_CLIENT_METADATA_DOCUMENTS), fetched with the toolkit's SSRF-hardened
    # fetcher (https only, public addresses only, no redirects, small and bounded in time), through a wrapper that
    # keeps why a fetch failed for the error page (oauth/metadata_documents.py).
    "CIMD_ENABLED": CLIENT_METADATA_DOCUMENTS,
    "CIMD_METADATA_FETCHER": "oauth.metadata_documents.ExplainingMetadataFetcher",
    "CIMD_FETCH_TIMEOUT_SECONDS": 5,
    "CIMD_MAX_DOCUMENT_SIZE": 16 * 1024,  # also the cap of a registration's body (oauth/views/registration.py)
    # RFC 9728: the protected resource is exactly <public url>/mcp, served by this issuer.
    "OAUTH2_PROTECTED_RESOURCE_IDENTIFIER": MCP_RESOURCE_URL,
    "OAUTH2_PROTECTED_RESOURCE_AUTHORIZATION_SERVERS": [PUBLIC_URL],
    "OAUTH2_PROTECTED_RESOURCE_NAME": "Sandstorm",
}

# --- several workers (docs/scaling.md) -----------------------------------------------------------------------------
# SANDSTORM_WORKERS server processes behind one Caddy site, this one number SANDSTORM_WORKER (1..N; the systemd
# template unit's instance). More than one share PostgreSQL (DATABASE_URL) and Redis (SANDSTORM_REDIS_URL): the
# channel layer, the per-credential limits, revocation's wake-up. Keys and channel names start with
# SANDSTORM_REDIS_PREFIX, so installations (or test servers) may share one Redis.
WORKERS = env_int("SANDSTORM_WORKERS", 1, minimum=1, maximum=64)
WORKER = env_int("SANDSTORM_WORKER", 1, minimum=1, maximum=WORKERS)
REDIS_URL = env_redis_url("SANDSTORM_REDIS_URL")
REDIS_PREFIX = env_str("SANDSTORM_REDIS_PREFIX", "sandstorm")
if WORKERS > 1 and not (_database_url and REDIS_URL):
    raise ImproperlyConfigured(
        f"SANDSTORM_WORKERS={WORKERS} needs DATABASE_URL (PostgreSQL) and SANDSTORM_REDIS_URL: several workers "
        "share their database, limits and channel layer (docs/scaling.md); SQLite serves one worker"
    )

# --- Channels ----------------------------------------------------------------------------------------------------
# The console's live view and approval cards (mcpserver/live, mcpserver/approvals) travel over a channel layer: the
# in-memory one within one process, Redis's between workers.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # A read timeout longer than the layer's blocking receive (5 s), which redis-py's default (5 s) is not.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}], "prefix": f"{REDIS_PREFIX}:layer"},
    }
    if REDIS_URL
    else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
}

# --- e-mail ------------------------------------------------------------------------------------------------------
# Approval requests can be mailed to SANDSTORM_APPROVAL_EMAIL through Django's e-mail backend (SMTP settings below).
EMAIL_BACKEND = env_str("SANDSTORM_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("SANDSTORM_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("SANDSTORM_EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("SANDSTORM_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("SANDSTORM_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("SANDSTORM_EMAIL_TLS", False)
DEFAULT_FROM_EMAIL = env_str("SANDSTORM_EMAIL_FROM", f"sandstorm@{PUBLIC_HOST}")
