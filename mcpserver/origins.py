"""The Host and Origin checks of /mcp (DNS-rebinding protection), by parsed authority, exactly.

Allowed: the public URL's host and port, and a loopback host (127.0.0.1, [::1], localhost) on any port; an Origin
must be such an origin (`scheme://host[:port]`, nothing more), or absent. The SDK's own check compares strings by
prefix (`http://localhost:*` lets `http://localhost:1@evil.example` through), so it is off (mcpserver/application.py) and
this one, in front of everything else, is the only one. Both headers are parsed by oauth/authority.py.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from mcpserver.authentication import send_json
from oauth.authority import Authority, parse_authority


class HostOriginCheck:
    def __init__(self, app: ASGIApp, *, public_url: str) -> None:
        self.app = app
        public = urlsplit(public_url)
        authority = parse_authority(public.netloc)
        if authority is None:
            raise ValueError(f"the public URL has no plain host: {public_url!r}")
        self.public_scheme = public.scheme
        self.public = (authority.host, authority.effective_port(public.scheme))

    def allows(self, authority: Authority | None, scheme: str) -> bool:
        if authority is None:
            return False
        return authority.is_loopback or (authority.host, authority.effective_port(scheme)) == self.public

    def host_allowed(self, values: list[str]) -> bool:
        return len(values) == 1 and self.allows(parse_authority(values[0]), self.public_scheme)

    def origin_allowed(self, values: list[str]) -> bool:
        if not values:
            return True  # not sent by a browser page of another origin, so no rebinding to fear
        if len(values) != 1:
            return False
        scheme, separator, netloc = values[0].partition("://")
        if not separator or scheme not in ("http", "https"):
            return False  # `null` included: an opaque origin is nobody we know
        return self.allows(parse_authority(netloc), scheme)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, list[str]] = {b"host": [], b"origin": []}
        for name, value in scope["headers"]:
            if name in headers:
                headers[name].append(value.decode("latin-1"))
        if not self.host_allowed(headers[b"host"]):
            body = {"error": "invalid_host", "error_description": "This server does not answer for that Host."}
            await send_json(send, 421, body, [])
            return
        if not self.origin_allowed(headers[b"origin"]):
            body = {"error": "invalid_origin", "error_description": "Requests from pages of that origin are refused."}
            await send_json(send, 403, body, [])
            return
        await self.app(scope, receive, send)
