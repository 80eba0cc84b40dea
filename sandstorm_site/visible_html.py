"""Every HTML page the site serves shows control and bidirectional characters as visible code points.

Admin pages, the audit log's and the consent page among them, show text that agents, repositories and OAuth
clients chose: a tool's arguments and output, a client's registered name. One pass over the finished page covers
every place such text lands (lists, details, titles, form values, messages) where escaping in each template would
miss one. The page's own markup holds none of these characters, so nothing of it changes. Streamed responses (the
exports) are not HTML and escape their cells themselves (audit/export.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

from audit.visible import make_visible_in_html


def make_page_visible(response: HttpResponseBase) -> HttpResponseBase:
    if not isinstance(response, HttpResponse) or not response.get("Content-Type", "").startswith("text/html"):
        return response
    html = response.content.decode(response.charset, errors="replace")
    shown = make_visible_in_html(html)
    if shown != html:
        response.content = shown.encode(response.charset)
        if response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
    return response


@sync_and_async_middleware
def visible_control_characters(
    get_response: Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]],
) -> Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]:
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponseBase:
            return make_page_visible(await get_response(request))

        return async_middleware

    sync_get_response = cast(Callable[[HttpRequest], HttpResponseBase], get_response)  # not a coroutine function

    def middleware(request: HttpRequest) -> HttpResponseBase:
        return make_page_visible(sync_get_response(request))

    return middleware
