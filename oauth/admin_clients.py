"""OAuth clients and their tokens in the admin: read-only lists with audited revoke actions.

Replaces the toolkit's admin pages, which would let an admin edit a client into `skip_authorization` or another
grant type, and show empty token columns (tokens are stored hashed). Authorization codes live 60 seconds and
OIDC is off, so their pages are dropped.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, IDToken, RefreshToken

from audit.log import event, request_actor
from oauth.credentials import application_label
from oauth.revocation import revoke_access_tokens, revoke_clients

for model in (Application, AccessToken, RefreshToken, Grant, IDToken):
    if admin.site.is_registered(model):
        admin.site.unregister(model)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Application)
class ClientAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "client_id",
        "registration_source",
        "client_type",
        "created",
        "registered_from",
        "last_token",
        "live_tokens",
    ]
    list_filter = ["registration_source", "client_type"]
    search_fields = ["name", "client_id"]
    fields = [
        "name",
        "client_id",
        "registration_source",
        "client_type",
        "authorization_grant_type",
        "redirect_uris",
        "created",
        "updated",
    ]
    actions = ["revoke", "revoke_and_remove"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Application]:
        live = Q(accesstoken__expires__gt=timezone.now(), accesstoken__user__isnull=False)
        return (
            super()
            .get_queryset(request)
            .select_related("sandstorm_registration")
            .annotate(live_token_count=Count("accesstoken", filter=live, distinct=True))
        )

    @admin.display(description="registered from")
    def registered_from(self, obj: Application) -> str:
        registration = getattr(obj, "sandstorm_registration", None)
        return registration.client_address if registration else "—"

    @admin.display(description="last token")
    def last_token(self, obj: Application) -> object:
        registration = getattr(obj, "sandstorm_registration", None)
        return registration.last_token_at if registration and registration.last_token_at else "never"

    @admin.display(description="live access tokens")
    def live_tokens(self, obj: Application) -> int:
        return int(getattr(obj, "live_token_count", 0))

    @admin.action(description="Revoke every token of the selected clients")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Application]) -> None:
        count = revoke_clients(queryset, request_actor(request))
        self.message_user(
            request,
            f"Revoked the tokens of {count} client(s); their running tool calls were cancelled and their background processes are being stopped.",
            messages.SUCCESS,
        )

    @admin.action(description="Revoke and remove the selected clients")
    def revoke_and_remove(self, request: HttpRequest, queryset: QuerySet[Application]) -> None:
        actor = request_actor(request)
        chosen = list(queryset)
        revoke_clients(Application.objects.filter(pk__in=[app.pk for app in chosen]), actor)
        for application in chosen:
            event(
                "oauth.client_removed",
                actor,
                client_id=application.client_id,
                client=application_label(application.name, application.client_id),
            )
            application.delete()
        self.message_user(
            request, f"Removed {len(chosen)} client(s). They must register again to connect.", messages.SUCCESS
        )


@admin.register(AccessToken)
class AccessTokenAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "application", "scope", "kind", "created", "expires"]
    list_filter = ["application"]
    search_fields = ["user__username", "application__name", "application__client_id"]
    fields = ["id", "user", "application", "scope", "resource", "created", "expires"]
    actions = ["revoke"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AccessToken]:
        return super().get_queryset(request).select_related("user", "application")

    @admin.display(description="kind")
    def kind(self, obj: AccessToken) -> str:
        if obj.user_id is None:
            return "registration" if obj.scope == "oauth2_provider:registration" else "no user (refused)"
        return "expired" if obj.is_expired() else "access"

    @admin.action(description="Revoke the selected access tokens (with their refresh tokens)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[AccessToken]) -> None:
        count = revoke_access_tokens(queryset, request_actor(request))
        self.message_user(
            request,
            f"Revoked {count} access token(s) and their refresh-token families; the running tool calls and background processes of their clients are being stopped.",
            messages.SUCCESS,
        )


@admin.register(RefreshToken)
class RefreshTokenAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "application", "token_family", "created", "revoked"]
    list_filter = [("revoked", admin.EmptyFieldListFilter), "application"]
    search_fields = ["user__username", "application__name", "application__client_id"]
    fields = ["id", "user", "application", "token_family", "created", "revoked"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[RefreshToken]:
        return super().get_queryset(request).select_related("user", "application")
