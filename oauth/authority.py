"""One strict parser for the authority of a URL (`host[:port]`), used wherever a host decides what is allowed:
redirect URIs at registration and at authorization (oauth/redirects.py) and the Host and Origin headers of /mcp
(mcpserver/origins.py).

Python's `urlsplit` is lax: `http://[::1].evil.example/cb` has the hostname `::1`, and `0x7f.0.0.1` or `127.1` are
names to it but 127.0.0.1 to a browser. So an authority is taken only in one plain form (a DNS name, a dotted-quad
IPv4 address or a bracketed IPv6 address without a zone, then an optional port) and anything else is refused.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# The hosts RFC 8252 section 7.3 calls loopback, plus "localhost", which Claude Code uses. Only these spellings.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "[::1]", "localhost"})
DEFAULT_PORTS = {"http": 80, "https": 443}
_PORT = re.compile(r"[0-9]{1,5}")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# A last label a browser would read as a number (WHATWG URL "ends in a number"): an IPv4 address or nothing.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


@dataclass(frozen=True)
class Authority:
    host: str  # lower case; an IPv6 address in brackets, as written
    port: int | None

    @property
    def is_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    def effective_port(self, scheme: str) -> int | None:
        return self.port if self.port is not None else DEFAULT_PORTS.get(scheme)


def _plain_host(host: str) -> bool:
    if host.startswith("["):
        if not host.endswith("]"):
            return False
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return address.scope_id is None  # a zone ("%25eth0") names an interface, not a host
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            ipaddress.IPv4Address(host)  # dotted quad only: no 127.1, 0x7f.0.0.1 or leading zeros
        except ValueError:
            return False
        return True
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)  # no empty label: no trailing dot


def parse_authority(netloc: str) -> Authority | None:
    """`netloc` as host and port, or None unless it is exactly `host[:port]` (no user information, nothing else)."""
    host, port_text = netloc.lower(), None
    if not host.endswith("]") and ":" in host:
        host, _, port_text = host.rpartition(":")
    port = None
    if port_text is not None:
        if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    if not host or not _plain_host(host):
        return None
    return Authority(host, port)
