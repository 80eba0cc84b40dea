"""Where a credential's confirmation page sends the admin once it has acted: back to the console page they came
from (`?next=`, carried through the form: the Live view's "Revoke credential" names the Live page), else the
credential's own page. Only a page of this site is followed, never another host (no open redirect)."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme

RETURN_FIELD = "next"


def return_url(request: HttpRequest, default: str) -> str:
    """The `next` the GET or the form names, if it is a page of this site; else `default`."""
    wanted = request.POST.get(RETURN_FIELD) or request.GET.get(RETURN_FIELD) or ""
    if wanted and url_has_allowed_host_and_scheme(wanted, {request.get_host()}, request.is_secure()):
        return wanted
    return default
