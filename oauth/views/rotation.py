"""The admin's "Rotate all credentials" page: a confirmation that names what will be cut off, then the rotation
(POST), then a redirect to the result page (GET), which shows the one new bearer token once.

POST -> redirect -> GET: the secret is kept in the session for one showing (oauth.shown_once), so reloading the
result page, or coming back to it, says it was shown already instead of rotating a second time.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from audit.log import request_actor
from oauth import shown_once
from oauth.claude_code import claude_code_line
from oauth.models import CredentialRotation, Revocation
from oauth.rotation import RotationCounts, describe, preview, rotate_all

HISTORY = 10
SHOWN_ONCE_WHAT = "rotation"
RESULT_URL_NAME = "oauth_credentialrotation_result"


def _no_store(response: HttpResponse) -> HttpResponse:
    # Neither the secret nor counts that are stale after a rotation may come back from a cache (or the Back button).
    response["Cache-Control"] = "no-store"
    return response


def rotation_page(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    if request.method == "POST" and request.POST.get("confirm") == "rotate":
        return rotate(request)
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": CredentialRotation._meta,
        "title": "Rotate all credentials",
        "cut_off": preview(keep_session_key=request.session.session_key),
        "history": Revocation.objects.filter(reason=Revocation.REASON_ROTATION)[:HISTORY],
    }
    return _no_store(TemplateResponse(request, "admin/oauth/rotate.html", context))


def rotate(request: HttpRequest) -> HttpResponse:
    result = rotate_all(
        by=request_actor(request),
        new_owner=cast(User, request.user),  # the admin site lets only signed-in staff users here
        stop_background=request.POST.get("stop_background") == "on",
        keep_session_key=request.session.session_key,
    )
    token = result.new_token
    ticket = shown_once.keep(
        request,
        SHOWN_ONCE_WHAT,
        {
            "secret": result.new_secret,
            "token_id": token.pk,
            "token_name": token.name,
            "token_prefix": token.prefix,
            "owner": token.user.get_username(),
            "counts": asdict(result.counts),
        },
    )
    return HttpResponseRedirect(reverse(f"admin:{RESULT_URL_NAME}", args=[ticket]))


def rotation_result(model_admin: admin.ModelAdmin, request: HttpRequest, ticket: str) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    if request.method != "GET":  # not even HEAD: a link checker's HEAD must not use up the one showing
        return HttpResponseNotAllowed(["GET"])
    payload = shown_once.take(request, SHOWN_ONCE_WHAT, ticket)
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": CredentialRotation._meta,
        "title": "All credentials rotated" if payload else "Already shown",
        "already_shown": payload is None,
    }
    if payload is not None:
        counts = RotationCounts(**payload["counts"])
        context.update(
            counts=counts,
            summary=describe(counts),
            token=payload,
            secret=payload["secret"],
            claude_line=claude_code_line(settings.MCP_RESOURCE_URL, payload["secret"]),
        )
    return _no_store(TemplateResponse(request, "admin/oauth/rotated.html", context))
