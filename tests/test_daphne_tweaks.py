"""Daphne, with sandstorm_site.daphne_tweaks applied, builds its requests without Twisted's form parse, and passes
the body on unchanged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from daphne import http_protocol
from daphne.http_protocol import HTTPFactory
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from sandstorm_site import daphne_tweaks

FORM = b"a=1&b=2"


@pytest.fixture(autouse=True)
def applied() -> None:
    daphne_tweaks.apply()


class StandInServer:
    """What Daphne's request asks of its server: the application's queue receives what the application would."""

    root_path = ""
    request_buffer_size = 8192
    server_name = "daphne"
    proxy_forwarded_address_header = None

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.scopes: list[dict[str, Any]] = []
        self.application_queue = asyncio.Queue[dict[str, Any]]()

    def protocol_connected(self, request: Any) -> None:
        self.requests.append(request)

    def protocol_disconnected(self, request: Any) -> None:
        pass

    def create_application(self, request: Any, scope: dict[str, Any]) -> asyncio.Queue[dict[str, Any]]:
        self.scopes.append(scope)
        return self.application_queue


def received(content_type: bytes, body: bytes) -> tuple[Any, dict[str, Any]]:
    """The request Daphne's own factory builds for one raw HTTP/1.1 POST, and the body message its application gets."""
    server = StandInServer()
    protocol = HTTPFactory(server).buildProtocol(IPv4Address("TCP", "127.0.0.1", 5000))
    protocol.makeConnection(StringTransport())
    head = f"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type.decode()}\r\nContent-Length: {len(body)}\r\n\r\n"
    protocol.dataReceived(head.encode() + body)
    assert len(server.requests) == len(server.scopes) == 1
    return server.requests[0], server.application_queue.get_nowait()


@pytest.mark.parametrize("content_type", [b"application/x-www-form-urlencoded", b"application/json; charset=utf-8"])
def test_daphnes_requests_skip_twisteds_form_parse_and_keep_the_body(content_type: bytes) -> None:
    request, message = received(content_type, FORM)
    assert isinstance(request, daphne_tweaks.FormlessWebRequest), (
        "Daphne no longer builds its requests through daphne.http_protocol.WebRequest (see sandstorm_site.daphne_tweaks)"
    )
    assert request.args == {}  # Twisted's parse would have put the form here
    assert message == {"type": "http.request", "body": FORM, "more_body": False}


def test_applying_twice_changes_nothing() -> None:
    daphne_tweaks.apply()
    assert http_protocol.WebRequest is daphne_tweaks.FormlessWebRequest


def test_apply_refuses_a_daphne_that_no_longer_has_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(http_protocol, "WebRequest")
    with pytest.raises(RuntimeError, match="no longer builds its requests"):
        daphne_tweaks.apply()
