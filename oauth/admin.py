"""Credentials in the admin. Bearer tokens: created here, their secret shown once on the page the creation redirects
to (oauth.shown_once: a reload says "already shown" instead of making a second token); each has a page with its
status, use, recent calls, open MCP sessions and confinement profile (changed there, the change recorded), and
confirmations to revoke, regenerate (views/regenerate.py), suspend and resume it (views/suspension.py);
a `host` token is badged as a warning wherever tokens are listed; revoked, never deleted (their rows stay so the
audit log can name them). OAuth clients ("Connected apps") and their tokens: see admin_clients. "Rotate all credentials": the
kill switch (views/rotation.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.forms import ModelForm
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from audit.log import request_actor
from oauth import admin_clients, admin_devices, confinement, shown_once  # noqa: F401  (OAuth clients' pages; no devices)
from oauth.agent_identity import agent_os_user
from oauth.claude_code import claude_code_line
from oauth.console_lists import ConsoleList, moment, status_badge, two_lines
from oauth.credential_activity import (
    bearer_calls,
    credential_audit_url,
    failed_yesterday_url,
    last_use,
    recent_calls,
    running_count,
)
from oauth.credentials import KIND_BEARER
from oauth.models import SCOPE_ALL, SCOPE_CHOICES, SCOPE_WORDS, BearerToken, CredentialRotation, new_token_secret
from oauth.return_to import RETURN_FIELD, return_url
from oauth.session_links import bearer_sessions
from oauth.token_form import NewTokenForm, RenameTokenForm
from oauth.tokens import revoke_tokens, save_new_token
from oauth.views.regenerate import CREATED_WHAT, regenerate_view
from oauth.views.rotation import RESULT_URL_NAME, rotation_page, rotation_result
from oauth.views.suspension import RESUME, SUSPEND, token_suspension

TICKET_ATTRIBUTE = "_sandstorm_new_token_ticket"
REVOKED_MESSAGE = (
    "Revoked token “{name}”. It is refused from its next request; its running tool calls were cancelled and its "
    "background processes are being stopped."
)
# "mcp: every tool" -> "every tool", under the scope in the list
SCOPE_SHORT_WORDS = {scope: label.partition(": ")[2] for scope, label in SCOPE_CHOICES}


class TokenStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [(status, status) for status in ("active", "suspended", "expired", "revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[BearerToken]) -> QuerySet[BearerToken]:
        unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        chosen = {  # as BearerToken.status words them
            "active": Q(revoked_at__isnull=True, suspended_at__isnull=True) & unexpired,
            "suspended": Q(revoked_at__isnull=True, suspended_at__isnull=False) & unexpired,
            "expired": Q(revoked_at__isnull=True) & ~unexpired,
            "revoked": Q(revoked_at__isnull=False),
        }.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen)


@admin.register(BearerToken)
class BearerTokenAdmin(ConsoleList):
    # What tells tokens apart, in cells that fit a 1280 px window (oauth.console_lists); the rest is on its page.
    list_display = ["token", "status", "owner", "scope_cell", "confinement_badge", "last_used", "expires"]
    list_filter = [TokenStatusFilter, "scope", "confinement", "user"]
    list_select_related = ["user"]
    search_fields = ["name", "prefix", "user__username"]
    actions = ["revoke"]
    change_form_template = "admin/oauth/bearertoken/change_form.html"

    def get_form(self, request: HttpRequest, obj: BearerToken | None = None, change: bool = False,
                 **kwargs: Any) -> type[ModelForm[BearerToken]]:  # fmt: skip
        kwargs["form"] = RenameTokenForm if obj is not None else NewTokenForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: BearerToken | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "user", "scope", "confinement", "expiry", "expires_on")
        return ("name", "confinement") if SCOPE_ALL in obj.scopes else ("name",)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"user": request.user.pk, **super().get_changeform_initial_data(request)}

    def has_change_permission(self, request: HttpRequest, obj: BearerToken | None = None) -> bool:
        if obj is not None and obj.revoked_at is not None:
            return False  # a revoked token's page is read-only; its name stays as the audit log knows it
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: BearerToken | None = None) -> bool:
        return False

    def may_revoke(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)

    @admin.display(description="name", ordering="name")
    def token(self, obj: BearerToken) -> str:
        return two_lines(obj.name, f"{obj.prefix}…")

    @admin.display(description="status")
    def status(self, obj: BearerToken) -> str:
        return status_badge(obj.status)

    @admin.display(description="owner", ordering="user__username")
    def owner(self, obj: BearerToken) -> str:
        return str(obj.user.get_username())

    @admin.display(description="scope", ordering="scope")
    def scope_cell(self, obj: BearerToken) -> str:
        return two_lines(obj.scope, SCOPE_SHORT_WORDS.get(obj.scope, ""))

    @admin.display(description="confinement", ordering="confinement")
    def confinement_badge(self, obj: BearerToken) -> str:
        return confinement.badge(obj.confinement, obj.scope)

    @admin.display(description="last use", ordering="last_used_at")
    def last_used(self, obj: BearerToken) -> str:
        return moment(obj.last_used_at, "never")

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: BearerToken) -> str:
        return moment(obj.expires_at, "never")

    # --- the token's page -------------------------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [
            path("<path:object_id>/revoke/", self.admin_site.admin_view(self.revoke_view), name=f"{prefix}_revoke"),
            path("<path:object_id>/regenerate/", self.action_view(regenerate_view), name=f"{prefix}_regenerate"),
            path("<path:object_id>/suspend/", self.action_view(token_suspension, SUSPEND), name=f"{prefix}_suspend"),
            path("<path:object_id>/resume/", self.action_view(token_suspension, RESUME), name=f"{prefix}_resume"),
            path(
                "<path:object_id>/created/<str:ticket>/",
                self.admin_site.admin_view(self.created_view),
                name=f"{prefix}_created",
            ),
        ]
        return own + super().get_urls()

    def action_view(self, view: Callable[..., HttpResponse], *args: str) -> Callable[..., HttpResponse]:
        """A token's page of its own (views/regenerate.py, views/suspension.py), for who may revoke it."""

        def action(request: HttpRequest, object_id: str) -> HttpResponse:
            token = self.token_or_404(request, object_id)
            if not self.may_revoke(request):
                raise PermissionDenied
            return view(self, request, token, *args)

        return self.admin_site.admin_view(action)

    def token_or_404(self, request: HttpRequest, object_id: str) -> BearerToken:
        token = self.get_object(request, unquote(object_id))
        if token is None:
            raise Http404("No such token.")
        if not self.has_view_or_change_permission(request, token):
            raise PermissionDenied
        return token

    def token_detail(self, request: HttpRequest, token: BearerToken) -> dict[str, Any]:
        calls = bearer_calls(token.pk)
        return {
            "token": token,
            "status_badge": status_badge(token.status),
            "scope_words": SCOPE_WORDS.get(token.scope, token.scope),
            "confinement_badge": confinement.badge(token.confinement, token.scope),
            "confinement_line": confinement.reach_words(token.confinement, token.scope, agent_os_user()),
            "full_scope": SCOPE_ALL in token.scopes,
            "confinement_note": confinement.enforcement_note(token.confinement, token.scope),
            "last_use": last_use(calls),
            "recent_calls": recent_calls(calls),
            "audit_url": credential_audit_url(KIND_BEARER, token.pk),
            "failed_yesterday_url": failed_yesterday_url(KIND_BEARER, token.pk),
            "sessions": bearer_sessions(token.pk) if token.revoked_at is None else None,
            **self.action_urls(request, token),
        }

    def action_urls(self, request: HttpRequest, token: BearerToken) -> dict[str, str]:
        """What the admin may do to the token from its page: revoke, regenerate, suspend or resume."""
        if token.revoked_at is not None or not self.may_revoke(request):
            return {}
        urls = {"revoke_url": reverse("admin:oauth_bearertoken_revoke", args=[token.pk])}
        if token.is_active and self.has_add_permission(request):
            urls["regenerate_url"] = reverse("admin:oauth_bearertoken_regenerate", args=[token.pk])
        if token.suspended_at is not None:
            urls["resume_url"] = reverse("admin:oauth_bearertoken_resume", args=[token.pk])
        elif token.is_active:  # an expired token has nothing to suspend
            urls["suspend_url"] = reverse("admin:oauth_bearertoken_suspend", args=[token.pk])
        return urls

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        token = self.get_object(request, unquote(object_id))
        if token is not None and self.has_view_or_change_permission(request, token):
            extra_context = {
                **(extra_context or {}),
                **self.token_detail(request, token),
                "title": f"Token “{token.name}”",
                "show_save_and_add_another": False,
            }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- creating: POST, then redirect to a page that shows the secret once -------------------------------------------

    def save_model(self, request: HttpRequest, obj: BearerToken, form: Any, change: bool) -> None:
        if change:
            # Only what the form changed, so a profile changed meanwhile by another admin is not written back; the
            # profile through oauth.confinement, which records who changed it from what to what.
            if "name" in form.changed_data:
                obj.save(update_fields=["name"])
            if "confinement" in form.changed_data and SCOPE_ALL in obj.scopes:
                confinement.change_token_confinement(obj, form.cleaned_data["confinement"], request_actor(request))
            return
        raw = new_token_secret()
        obj.set_secret(raw)
        save_new_token(obj, request_actor(request))
        ticket = shown_once.keep(request, CREATED_WHAT, {"token_id": obj.pk, "secret": raw})
        setattr(request, TICKET_ATTRIBUTE, ticket)

    def response_add(
        self, request: HttpRequest, obj: BearerToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        ticket = getattr(request, TICKET_ATTRIBUTE, None)
        if ticket is None:
            return super().response_add(request, obj, post_url_continue)
        return HttpResponseRedirect(reverse("admin:oauth_bearertoken_created", args=[obj.pk, ticket]))

    def created_view(self, request: HttpRequest, object_id: str, ticket: str) -> HttpResponse:
        token = self.token_or_404(request, object_id)
        payload = shown_once.take(request, CREATED_WHAT, ticket)
        secret = str(payload["secret"]) if payload and payload.get("token_id") == token.pk else ""
        regenerated_from = str(payload.get("regenerated_from", "")) if secret and payload else ""
        done = "regenerated" if regenerated_from else "created"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Token “{token.name}” {done}" if secret else "Token already shown",
            "token": token,
            "secret": secret,
            "regenerated_from": regenerated_from,
            "scope_words": SCOPE_WORDS.get(token.scope, token.scope),
            "confinement_badge": confinement.badge(token.confinement, token.scope),
            "confinement_line": confinement.reach_words(token.confinement, token.scope, agent_os_user()),
            "claude_line": claude_code_line(settings.MCP_RESOURCE_URL, secret) if secret else "",
            "mcp_url": settings.MCP_RESOURCE_URL,
            "token_url": reverse("admin:oauth_bearertoken_change", args=[token.pk]),
            "media": self.media,
        }
        response = TemplateResponse(request, "admin/oauth/bearertoken/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    # --- revoking: a confirmation page (GET) and the revocation (POST) ----------------------------------------------

    def revoke_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        token = self.token_or_404(request, object_id)
        if not self.may_revoke(request):
            raise PermissionDenied
        token_url = reverse("admin:oauth_bearertoken_change", args=[token.pk])
        back = return_url(request, token_url)  # the Live view's "Revoke credential" comes back to Live
        if request.method == "POST":
            if revoke_tokens(BearerToken.objects.filter(pk=token.pk), request_actor(request)):
                self.message_user(request, REVOKED_MESSAGE.format(name=token.name), messages.SUCCESS)
            else:
                self.message_user(request, f"Token “{token.name}” was revoked already.", messages.INFO)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Revoke token “{token.name}”?",
            "token": token,
            "status_badge": status_badge(token.status),
            "running": running_count(bearer_calls(token.pk)),
            "token_url": token_url,
            "back": back,
            "return_field": RETURN_FIELD,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/oauth/bearertoken/revoke.html", context)

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[BearerToken]) -> None:
        count = revoke_tokens(queryset, request_actor(request))
        self.message_user(
            request,
            f"Revoked {count} token(s). Agents using them are refused from their next request; their running tool calls "
            "were cancelled and their background processes are being stopped.",
            messages.SUCCESS,
        )


@admin.register(CredentialRotation)
class CredentialRotationAdmin(admin.ModelAdmin):
    """Listed on the admin index as "Rotate all credentials"; its list page is the rotation page. Superusers only."""

    def has_view_permission(self, request: HttpRequest, obj: CredentialRotation | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: CredentialRotation | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: CredentialRotation | None = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return rotation_page(self, request)

    def get_urls(self) -> list[URLPattern]:
        # The result page, reached by the redirect after the rotation; before the stock `<object_id>/` patterns.
        def result(request: HttpRequest, ticket: str) -> HttpResponse:
            return rotation_result(self, request, ticket)

        view = self.admin_site.admin_view(result)
        return [path("result/<str:ticket>/", view, name=RESULT_URL_NAME), *super().get_urls()]
