"""The admin's "Rotate all credentials" page: a confirmation that says what will be cut off, then the rotation, then
the one new bearer token, shown once."""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse

from audit.log import request_actor
from oauth.models import CredentialRotation, Revocation
from oauth.rotation import preview, rotate_all

HISTORY = 10


def rotation_page(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    if request.method == "POST" and request.POST.get("confirm") == "rotate":
        return rotate(model_admin, request)
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": CredentialRotation._meta,
        "title": "Rotate all credentials",
        "counts": preview(keep_session_key=request.session.session_key),
        "history": Revocation.objects.filter(reason=Revocation.REASON_ROTATION)[:HISTORY],
    }
    return TemplateResponse(request, "admin/oauth/rotate.html", context)


def rotate(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    result = rotate_all(
        by=request_actor(request),
        new_owner=cast(User, request.user),  # the admin site lets only signed-in staff users here
        stop_background=request.POST.get("stop_background") == "on",
        keep_session_key=request.session.session_key,
    )
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": CredentialRotation._meta,
        "title": "All credentials rotated",
        "counts": result.counts,
        "token": result.new_token,
        "secret": result.new_secret,
        "mcp_url": settings.MCP_RESOURCE_URL,
    }
    response = TemplateResponse(request, "admin/oauth/rotated.html", context)
    response["Cache-Control"] = "no-store"
    return response
