"""Requests carrying NUL characters are refused before any view sees them.

PostgreSQL can neither store a NUL in text nor compare one (the driver refuses the whole query), so such a value
reaching the database is a 500 there, while SQLite would store it: a client could tell the databases apart and fill
the error log. Refused on both with a 400 instead. Django's own forms (the admin) already refuse NULs; this covers
the OAuth endpoints, whose parameters go to the database as they come. /mcp is not a Django view: its JSON reaches
the database only through the audit log, which stores NULs as U+FFFD (audit/storable.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.http.request import QueryDict
from django.http.response import HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

NUL = "\x00"
FORM = "application/x-www-form-urlencoded"


def _holds_nul(fields: QueryDict) -> bool:
    return any(NUL in key or any(NUL in value for value in values) for key, values in fields.lists())


def holds_nul(request: HttpRequest) -> bool:
    if NUL in request.path or _holds_nul(request.GET):
        return True
    return request.method == "POST" and request.content_type == FORM and _holds_nul(request.POST)


def refusal() -> HttpResponse:
    return HttpResponseBadRequest("NUL characters are not allowed in a request.\n", content_type="text/plain")


@sync_and_async_middleware
def refuse_nul_characters(
    get_response: Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]],
) -> Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]:
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponseBase:
            if holds_nul(request):
                return refusal()
            return await get_response(request)

        return async_middleware

    sync_get_response = cast(Callable[[HttpRequest], HttpResponseBase], get_response)  # not a coroutine function

    def middleware(request: HttpRequest) -> HttpResponseBase:
        if holds_nul(request):
            return refusal()
        return sync_get_response(request)

    return middleware
