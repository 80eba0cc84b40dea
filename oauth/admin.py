"""Credentials in the admin. Bearer tokens: created here with the secret shown once, on the page after saving;
revoked, never deleted (their rows stay so the audit log can name them). OAuth clients and tokens: see
admin_clients. "Rotate all credentials": the kill switch (views/rotation.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from audit.log import request_actor
from oauth import admin_clients  # noqa: F401  (OAuth clients and tokens)
from oauth.models import BearerToken, CredentialRotation, new_token_secret
from oauth.tokens import revoke_tokens, save_new_token
from oauth.views.rotation import RESULT_URL_NAME, rotation_page, rotation_result

NEW_SECRET_ATTRIBUTE = "_sandstorm_new_token_secret"


@admin.register(BearerToken)
class BearerTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "user", "scope", "created_at", "last_used_at", "expires_at", "status"]
    list_filter = ["scope", ("revoked_at", admin.EmptyFieldListFilter), "user"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: BearerToken | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "user", "scope", "expires_at")
        return ("name", "user", "scope", "expires_at", "prefix", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request: HttpRequest, obj: BearerToken | None = None) -> list[str]:
        if obj is None:
            return []
        return ["user", "scope", *self.readonly_fields]

    def has_delete_permission(self, request: HttpRequest, obj: BearerToken | None = None) -> bool:
        return False

    @admin.display(description="status")
    def status(self, obj: BearerToken) -> str:
        if obj.revoked_at:
            return "revoked"
        return "active" if obj.is_active else "expired"

    def save_model(self, request: HttpRequest, obj: BearerToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        raw = new_token_secret()
        obj.set_secret(raw)
        setattr(request, NEW_SECRET_ATTRIBUTE, raw)  # lives only for this response, never in the session
        save_new_token(obj, request_actor(request))

    def response_add(
        self, request: HttpRequest, obj: BearerToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        raw = getattr(request, NEW_SECRET_ATTRIBUTE, None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "token": obj,
            "secret": raw,
            "opts": self.model._meta,
            "title": "Token created",
            "mcp_url": settings.MCP_RESOURCE_URL,
        }
        response = TemplateResponse(request, "admin/oauth/bearertoken/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

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
