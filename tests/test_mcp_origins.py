"""The Host and Origin checks of /mcp (mcpserver/origins.py), driven in-process: parsed authorities compared exactly,
never string prefixes. The live server's answers to the same headers are in tests/test_mcp_endpoint_live.py."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive, Scope, Send

from mcpserver.application import transport_security
from mcpserver.origins import HostOriginCheck

PUBLIC = "https://mcp.example.com"

HOSTILE_ORIGINS = [
    "http://localhost:1@evil.example",  # the SDK's prefix check lets this one through
    "http://localhost:8080@evil.example",
    "http://127.0.0.1:1@evil.example",
    "http://localhost.evil.example",
    "http://localhost:80.evil.example",
    "http://127.0.0.1.evil.example",
    "http://[::1].evil.example",
    "https://mcp.example.com.evil.example",
    "https://mcp.example.com@evil.example",
    "https://mcp.example.com:8443",
    "http://mcp.example.com",
    "https://evil.example",
    "null",
    "",
    "localhost",
    "file://",
    "http://localhost/",
    "http://localhost:8080/path",
    "http://0x7f.0.0.1",
    "http://127.1",
    "http://[::1%25lo]",
    "http://localhost.",
    "http://localhost:",
]
ALLOWED_ORIGINS = [
    "https://mcp.example.com",
    "https://MCP.example.com:443",
    "http://localhost:8080",
    "http://localhost",
    "https://127.0.0.1:3000",
    "http://[::1]:6274",
]
HOSTILE_HOSTS = ["localhost:1@evil.example", "evil.example", "mcp.example.com.evil.example", "localhost.evil.example",
                 "127.0.0.1.evil.example:80", "[::1].evil.example", "mcp.example.com:8443", "", "localhost:", "0x7f.0.0.1"]  # fmt: skip
ALLOWED_HOSTS = ["mcp.example.com", "mcp.example.com:443", "localhost:8080", "127.0.0.1", "[::1]:8080"]


def answer(headers: list[tuple[bytes, bytes]]) -> int:
    """The status HostOriginCheck answers with, or 200 if it passes the request on."""
    statuses: list[int] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        statuses.append(200)

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    scope: Scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    asyncio.run(HostOriginCheck(inner, public_url=PUBLIC)(scope, receive, send))
    return statuses[0]


@pytest.mark.parametrize("origin", HOSTILE_ORIGINS)
def test_a_foreign_or_malformed_origin_gets_403(origin: str) -> None:
    assert answer([(b"host", b"mcp.example.com"), (b"origin", origin.encode())]) == 403


@pytest.mark.parametrize("origin", ALLOWED_ORIGINS)
def test_the_public_origin_and_loopback_origins_pass(origin: str) -> None:
    assert answer([(b"host", b"mcp.example.com"), (b"origin", origin.encode())]) == 200


def test_no_origin_passes_and_two_origins_do_not() -> None:
    assert answer([(b"host", b"mcp.example.com")]) == 200
    assert (
        answer([(b"host", b"mcp.example.com"), (b"origin", PUBLIC.encode()), (b"origin", b"https://evil.example")])
        == 403
    )


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_a_foreign_or_malformed_host_gets_421(host: str) -> None:
    assert answer([(b"host", host.encode())]) == 421


@pytest.mark.parametrize("host", ALLOWED_HOSTS)
def test_the_public_host_and_loopback_hosts_pass(host: str) -> None:
    assert answer([(b"host", host.encode())]) == 200


def test_a_request_without_a_host_or_with_two_gets_421() -> None:
    assert answer([]) == 421
    assert answer([(b"host", b"mcp.example.com"), (b"host", b"evil.example")]) == 421


def test_the_sdks_prefix_checks_are_off_so_ours_alone_decides() -> None:
    assert transport_security().enable_dns_rebinding_protection is False
