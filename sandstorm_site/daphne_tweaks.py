"""Per-request work that Daphne and Twisted do for every HTTP request and Sandstorm has no use for.

Applied once, by sandstorm_site.asgi, in the Daphne process:

- Twisted writes a combined-log line for every request (query string and all) to its own log, which Daphne sends
  nowhere (verbosity 0 or 1): formatting it is wasted, and sandstorm_site.accesslog logs requests instead.
- Twisted parses each request's Content-Type header with the email package, to find out whether the body is a form
  (it never is at /mcp): a few dozen microseconds per request for the same few header values. The parse is a pure
  function of the header's bytes, so its results are kept, for at most CONTENT_TYPES distinct values.
"""

from __future__ import annotations

import functools

from daphne.http_protocol import HTTPFactory
from twisted.web import http

CONTENT_TYPES = 64


def apply() -> None:
    HTTPFactory.log = _no_line  # type: ignore[method-assign]
    if not hasattr(http._parseContentType, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=CONTENT_TYPES)(http._parseContentType)


def _no_line(factory: object, request: object) -> None:
    return None
