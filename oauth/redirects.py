"""Which redirect URIs a client may register and use: https, or plain http only to a loopback address.

The toolkit's ALLOWED_REDIRECT_URI_SCHEMES is global, so "https, or http only for loopback" is checked here, by
one function, at registration (DCR) and again at every authorization request (which also covers CIMD and manual
clients). The host is read by oauth/authority.py's strict parser, never by `urlsplit(...).hostname`.
Matching a request against the registered URIs stays the toolkit's: exact, except a loopback port.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from oauth.authority import Authority, parse_authority


def _printable_ascii(uri: str) -> bool:
    # urlsplit silently drops tabs and newlines (http://local<TAB>host/): the stored string is not what it parsed.
    return uri.isascii() and all(" " < char < "\x7f" for char in uri)


def _authority(parts: SplitResult) -> Authority | None:
    return parse_authority(parts.netloc) if parts.scheme in ("http", "https") else None


def loopback_authority(uri: str) -> Authority | None:
    """The authority of `uri` if it is an http URI to a loopback host (127.0.0.1, [::1], localhost), else None."""
    if not _printable_ascii(uri):
        return None
    parts = urlsplit(uri)
    authority = _authority(parts)
    return authority if parts.scheme == "http" and authority is not None and authority.is_loopback else None


def is_loopback(uri: str) -> bool:
    return loopback_authority(uri) is not None


def redirect_uri_refusal(uri: str) -> str | None:
    """Why `uri` may not be a redirect URI, or None if it may."""
    if not _printable_ascii(uri):
        return "a redirect URI must be printable ASCII without spaces"
    if "#" in uri:
        return "a redirect URI must not have a fragment"
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return "a redirect URI must use https, or http to a loopback address (127.0.0.1, [::1] or localhost)"
    if "@" in parts.netloc:
        return "a redirect URI must not carry user information"
    if _authority(parts) is None:
        return "a redirect URI must name its host plainly: a DNS name, an IPv4 address or a bracketed IPv6 address, then an optional port"
    if parts.scheme == "https" or loopback_authority(uri) is not None:
        return None
    return "a redirect URI must use https, or http to a loopback address (127.0.0.1, [::1] or localhost)"


def redirect_host(uri: str) -> str:
    """The host a redirect goes to, as the consent page shows it (with the port for loopback URIs)."""
    loopback = loopback_authority(uri)
    if loopback is not None:
        return loopback.host + (f":{loopback.port}" if loopback.port is not None else "")
    authority = _authority(urlsplit(uri)) if _printable_ascii(uri) else None
    return authority.host if authority is not None else ""
