"""Daphne builds its requests without Twisted's parse of a POSTed form, which Daphne never reads.

For every POST with a body, Twisted parses the Content-Type header with the email package to find out whether the
body is a form (it never is at /mcp), and parses a form into `request.args`. Daphne hands the raw body to the ASGI
application and never reads `request.args`, so both are wasted; Twisted's request takes a public argument,
`parsePOSTFormSubmission`, to skip them. The body the application receives is the same bytes either way.

A shim, pinned with Daphne and Twisted (daphne==4.2.3, Twisted==26.10.0, requirements.lock) and guarded by
tests/test_daphne_tweaks.py: Daphne's HTTPFactory.buildProtocol makes its channels build requests of the class named
WebRequest in daphne.http_protocol, and offers no option for the argument. The upstream change that removes it:
Daphne's WebRequest passing `parsePOSTFormSubmission=False` to twisted.web.http.Request (or an option of Daphne's
Server to do so).
"""

from __future__ import annotations

from typing import Any

from daphne import http_protocol
from daphne.http_protocol import WebRequest


class FormlessWebRequest(WebRequest):
    """Daphne's request, with Twisted's form parse (of a body Daphne passes on unparsed) turned off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)


def apply() -> None:
    """Have Daphne build every request as a FormlessWebRequest (the shim above); applied once, by sandstorm_site.asgi."""
    current = getattr(http_protocol, "WebRequest", None)
    if current is not WebRequest and current is not FormlessWebRequest:
        raise RuntimeError(f"daphne.http_protocol no longer builds its requests as expected: {current!r}")
    http_protocol.WebRequest = FormlessWebRequest
