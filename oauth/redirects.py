"""Which redirect URIs a client may register and use: https, or plain http only to a loopback address.

The toolkit's ALLOWED_REDIRECT_URI_SCHEMES is global, so "https, or http only for loopback" is checked here, at
registration (DCR) and again at every authorization request (which also covers CIMD and manual clients).
Matching a request against the registered URIs stays the toolkit's: exact, except a loopback port.
"""

from __future__ import annotations

from urllib.parse import urlsplit

# The hosts RFC 8252 section 7.3 calls loopback, plus "localhost", which Claude Code uses
# (the toolkit's ALLOW_LOCALHOST_LOOPBACK lets it match on any port too).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def is_loopback(uri: str) -> bool:
    parts = urlsplit(uri)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


def redirect_uri_refusal(uri: str) -> str | None:
    """Why `uri` may not be a redirect URI, or None if it may."""
    parts = urlsplit(uri)
    if "#" in uri:
        return "a redirect URI must not have a fragment"
    if "@" in parts.netloc:
        return "a redirect URI must not carry user information"
    if not parts.hostname:
        return "a redirect URI must name a host"
    try:
        parts.port  # noqa: B018  (a bad port raises here)
    except ValueError:
        return "a redirect URI must have a valid port"
    if parts.scheme == "https":
        return None
    if parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS:
        return None
    return "a redirect URI must use https, or http to a loopback address (127.0.0.1, [::1] or localhost)"


def redirect_host(uri: str) -> str:
    """The host a redirect goes to, as the consent page shows it (with the port for loopback URIs)."""
    parts = urlsplit(uri)
    return parts.netloc.rpartition("@")[2] if is_loopback(uri) else (parts.hostname or "")
