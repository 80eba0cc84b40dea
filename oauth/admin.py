"""Bearer tokens in the admin: created here with the secret shown once, on the page after saving; revoked, never
deleted (their rows stay so the audit log can name them)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from audit.recorder import request_actor
from oauth.models import BearerToken, new_token_secret
from oauth.tokens import revoke_tokens, save_new_token

NEW_SECRET_ATTRIBUTE = "_sandstorm_new_token_secret"


@admin.register(BearerToken)
class BearerTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "user", "scope", "created_at", "last_used_at", "expires_at", "status"]
    list_filter = ["scope", ("revoked_at", admin.EmptyFieldListFilter), "user"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: BearerToken | None = None) -> list[str]:
        if obj is None:
            return ["name", "user", "scope", "expires_at"]
        return ["name", "user", "scope", "expires_at", "prefix", "created_at", "last_used_at", "revoked_at"]

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

    def response_add(self, request: HttpRequest, obj: BearerToken, post_url_continue: str | None = None) -> HttpResponse:
        raw = getattr(request, NEW_SECRET_ATTRIBUTE, None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {**self.admin_site.each_context(request), "token": obj, "secret": raw, "opts": self.model._meta, "title": "Token created", "mcp_url": settings.MCP_RESOURCE_URL}
        response = TemplateResponse(request, "admin/oauth/bearertoken/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[BearerToken]) -> None:
        count = revoke_tokens(queryset, request_actor(request))
        self.message_user(request, f"Revoked {count} token(s). Agents using them are refused from their next request.", messages.SUCCESS)
