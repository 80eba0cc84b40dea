"""The per-request work of Daphne and Twisted that sandstorm_site.daphne_tweaks takes away changes no answer."""

from __future__ import annotations

from unittest import mock

import pytest
from daphne.http_protocol import HTTPFactory
from twisted.web import http

from sandstorm_site import daphne_tweaks

HEADERS = [
    b"application/json",
    b"application/json; charset=utf-8",
    b"Multipart/Form-Data; boundary=----x",
    b"application/x-www-form-urlencoded",
    b"text/plain;;; q=1",
    b"\xff\xfe not a type",
    b"",
]


@pytest.fixture(autouse=True)
def applied() -> None:
    daphne_tweaks.apply()


@pytest.mark.parametrize("header", HEADERS)
def test_a_kept_content_type_parse_gives_twisteds_own_answer(header: bytes) -> None:
    parse = http._parseContentType
    assert parse(header) == parse.__wrapped__(header) == parse(header)


def test_the_kept_parses_are_bounded_and_applying_twice_wraps_once() -> None:
    daphne_tweaks.apply()
    parse = http._parseContentType
    assert parse.cache_info().maxsize == daphne_tweaks.CONTENT_TYPES
    assert not hasattr(parse.__wrapped__, "cache_info")


def test_twisted_formats_no_combined_log_line() -> None:
    factory = HTTPFactory(server=mock.Mock())
    factory._logFile = mock.Mock()
    factory.log(mock.Mock())
    factory._logFile.write.assert_not_called()
