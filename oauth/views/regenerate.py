"""Regenerating a bearer token from its page: a confirmation (GET), the regeneration (POST, oauth.tokens
.regenerate_token), then a redirect to the page that shows the new secret once, the one a new token's creation
redirects to (oauth.admin `created_view`, oauth.shown_once).

Reload-safe and Back-safe as creation is: the secret is taken out of the session as it is shown, and a second POST
(a resubmitted form) finds the old token revoked and regenerates nothing.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from audit.log import request_actor
from oauth import shown_once
from oauth.credential_activity import bearer_calls, running_count
from oauth.models import BearerToken
from oauth.session_links import bearer_sessions
from oauth.tokens import NotRegenerable, name_holder, regenerate_token

CREATED_WHAT = "bearer_token_created"  # the showing of a new secret, a created token's too (oauth.admin)


def regenerate_view(
    model_admin: admin.ModelAdmin[BearerToken], request: HttpRequest, token: BearerToken
) -> HttpResponse:
    """GET: what regenerating `token` does; POST: regenerate it and show the new secret once. For who may revoke
    tokens (oauth.admin checks) and add them."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        return regenerate(request, token)
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": f"Regenerate token “{token.name}”?",
        "token": token,
        "token_url": reverse("admin:oauth_bearertoken_change", args=[token.pk]),
        "running": running_count(bearer_calls(token.pk)),
        "sessions": bearer_sessions(token.pk),
        "media": model_admin.media,
    }
    if token.revoked_at is not None:
        # Back to this page after a regeneration: the token that holds its name now, if any.
        current = name_holder(token.name)
        context["current_url"] = reverse("admin:oauth_bearertoken_change", args=[current.pk]) if current else ""
    response = TemplateResponse(request, "admin/oauth/bearertoken/regenerate.html", context)
    response["Cache-Control"] = "no-store"
    return response


def regenerate(request: HttpRequest, token: BearerToken) -> HttpResponse:
    stop_background = request.POST.get("stop_background") == "on"
    try:
        old, new, secret = regenerate_token(token.pk, request_actor(request), stop_background=stop_background)
    except NotRegenerable as refused:
        messages.error(request, f"Nothing was regenerated. {refused}")
        return HttpResponseRedirect(reverse("admin:oauth_bearertoken_change", args=[token.pk]))
    ticket = shown_once.keep(
        request, CREATED_WHAT, {"token_id": new.pk, "secret": secret, "regenerated_from": old.prefix}
    )
    return HttpResponseRedirect(reverse("admin:oauth_bearertoken_created", args=[new.pk, ticket]))
