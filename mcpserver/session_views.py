"""The console's page of open MCP sessions (/admin/sessions/): who holds each (the credential, the client's name,
the user it acts as), from where, since when and when it last asked anything; and **Disconnect**, behind a
confirmation, which ends a session in whichever worker holds it (mcpserver.session_console) and is audited.

Listing needs the view permission of bearer tokens or of connected apps (each kind's sessions are shown to who may
view that kind); disconnecting one needs the change permission of its credential's kind, as revoking it does.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from audit.log import event, request_actor
from mcpserver.open_sessions import Row
from mcpserver.session_console import count_sessions, end_session, list_sessions
from oauth.credentials import KIND_BEARER, KIND_OAUTH

SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
CREDENTIAL = re.compile(r"(bearer:\d{1,18}|oauth:\d{1,18}:(\d{1,18})?)")  # a principal key, or an app's prefix
VIEW = {KIND_BEARER: "oauth.view_bearertoken", KIND_OAUTH: "oauth.view_connectedapp"}
CHANGE = {KIND_BEARER: "oauth.change_bearertoken", KIND_OAUTH: "oauth.change_connectedapp"}


def visible_kinds(request: HttpRequest) -> set[str]:
    return {kind for kind, permission in VIEW.items() if request.user.has_perm(permission)}


def credential_url(row: Row) -> str:
    if row.get("credential_kind") == KIND_BEARER and row.get("credential_id"):
        return reverse("admin:oauth_bearertoken_change", args=[row["credential_id"]])
    if row.get("credential_kind") == KIND_OAUTH and row.get("application_id"):
        return reverse("admin:oauth_connectedapp_change", args=[row["application_id"]])
    return ""


def shown(row: Row, request: HttpRequest) -> dict[str, Any]:
    """A row as the page shows it: times as dates, links to its credential and to its disconnection."""
    kind = str(row.get("credential_kind", ""))
    may_end = request.user.has_perm(CHANGE[kind]) if kind in CHANGE else False
    return {
        **row,
        "kind_words": "OAuth app" if kind == KIND_OAUTH else "bearer token",
        "opened": datetime.fromtimestamp(float(row["opened_at"]), UTC),
        "last_request": datetime.fromtimestamp(float(row["last_request_at"]), UTC),
        "credential_url": credential_url(row),
        "disconnect_url": reverse("admin:mcp_session_disconnect", args=[row["session_id"]]) if may_end else "",
    }


def sessions_page(request: HttpRequest, site: AdminSite) -> TemplateResponse:
    kinds = visible_kinds(request)
    if not kinds:
        raise PermissionDenied
    credential = request.GET.get("credential", "")
    credential = credential if CREDENTIAL.fullmatch(credential) else ""
    listing = async_to_sync(list_sessions)(credential)
    rows = [shown(row, request) for row in listing.rows if row.get("credential_kind") in kinds]
    context = {
        **site.each_context(request),
        "title": "Open MCP sessions",
        "rows": rows,
        "serving": listing.serving,
        "silent_workers": listing.silent_workers,
        "several_workers": settings.WORKERS > 1,
        "worker": settings.WORKER,
        "credential": credential,
        "all_url": reverse("admin:mcp_sessions"),
    }
    response = TemplateResponse(request, "admin/mcpserver/sessions.html", context)
    response["Cache-Control"] = "no-store"  # a session ended meanwhile must not come back with the Back button
    return response


def disconnect(request: HttpRequest, site: AdminSite, session_id: str) -> HttpResponse:
    """GET: what disconnecting this session does; POST: do it."""
    if not SESSION_ID.fullmatch(session_id):
        raise Http404("No such session.")
    row = next((row for row in async_to_sync(list_sessions)().rows if row["session_id"] == session_id), None)
    back = safe_next(request)
    if row is None:
        messages.info(request, "That MCP session is no longer open: there is nothing to disconnect.")
        return HttpResponseRedirect(back)
    if not request.user.has_perm(CHANGE.get(str(row.get("credential_kind")), "-")):
        raise PermissionDenied
    if request.method == "POST":
        return disconnected(request, session_id, back)
    context = {**site.each_context(request), "title": "Disconnect this MCP session?", "row": shown(row, request),
               "back": back}  # fmt: skip
    return TemplateResponse(request, "admin/mcpserver/session_disconnect.html", context)


def disconnected(request: HttpRequest, session_id: str, back: str) -> HttpResponse:
    by = request.user.get_username()
    row = async_to_sync(end_session)(session_id, by)
    if row is None:
        messages.info(request, "That MCP session had closed already: nothing was disconnected.")
        return HttpResponseRedirect(back)
    event(
        "console.session_disconnected",
        request_actor(request),
        session_id=session_id,
        worker=row.get("worker"),
        credential=row.get("key"),
        credential_name=row.get("credential_name"),
        owner=row.get("username"),
        session_address=row.get("client_address"),
        session_user_agent=row.get("user_agent"),
        busy=bool(row.get("busy")),
    )
    messages.success(
        request,
        f"Disconnected the MCP session of “{row.get('credential_name')}”: its next request must open a new session; "
        "its running tool calls were cancelled. The credential still works: suspend or revoke it to keep it out.",
    )
    return HttpResponseRedirect(back)


def safe_next(request: HttpRequest) -> str:
    """Where to go back to: `next` if it is a page of this site, else the list of sessions."""
    wanted = request.POST.get("next") or request.GET.get("next") or ""
    if wanted and url_has_allowed_host_and_scheme(wanted, {request.get_host()}, request.is_secure()):
        return wanted
    return reverse("admin:mcp_sessions")


def count_open_sessions(credential: str) -> int | None:
    """oauth.session_links's counter: on the server's event loop, where its session ledger lives."""
    return async_to_sync(count_sessions)(credential)


def sessions_url(credential: str) -> str:
    return f"{reverse('admin:mcp_sessions')}?{urlencode({'credential': credential})}"
