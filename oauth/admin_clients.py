"""OAuth clients ("Connected apps") and their tokens in the admin: read-only pages with audited revocation and
suspension (for every user or one: admin_suspension, views/suspension.py), and each user's confinement profile of
an app, changed on its page (the change recorded; `host` badged as a warning).

Replaces the toolkit's admin pages, which would let an admin edit a client into `skip_authorization` or another
grant type, and show empty token columns (tokens are stored hashed). They are registered through proxies of this
app (oauth.models.ConnectedApp...), so they list under Credentials as "Connected apps", not under the toolkit's
name. Registration tokens (no user, scope `oauth2_provider:registration`) are internal and listed nowhere.
Authorization codes live 60 seconds and OIDC is off, so their pages are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html_join
from oauth2_provider.models import AccessToken, Application, Grant, IDToken, RefreshToken

from audit.log import event, request_actor
from oauth import confinement
from oauth.admin_suspension import AppSuspendedFilter, suspension_detail, with_suspension
from oauth.agent_identity import agent_os_user
from oauth.app_status import access_ends, app_status, live_tokens_prefetched
from oauth.app_users import AppConfinementForm, app_confinements, app_user_ids
from oauth.console_lists import ConsoleList, moment, status_badge, two_lines
from oauth.credential_activity import (
    app_audit_url,
    app_calls,
    approvals,
    credential_audit_url,
    last_use,
    recent_calls,
    running_count,
)
from oauth.credentials import KIND_OAUTH, application_label
from oauth.models import (
    SCOPE_ALL,
    SCOPE_WORDS,
    AppConfinement,
    ConnectedApp,
    ConnectedAppAccessToken,
    ConnectedAppRefreshToken,
)
from oauth.return_to import RETURN_FIELD, return_url
from oauth.revocation import revoke_access_tokens, revoke_clients
from oauth.views.suspension import RESUME, SUSPEND, app_suspension

REGISTRATION_SCOPE = "oauth2_provider:registration"
CLIENT_REVOKED_MESSAGE = (
    "Revoked every token of “{name}”. It is refused from its next request and must be approved again to connect; "
    "its running tool calls were cancelled and its background processes are being stopped."
)

for model in (Application, AccessToken, RefreshToken, Grant, IDToken):
    if admin.site.is_registered(model):
        admin.site.unregister(model)


def without_registration_tokens(tokens: QuerySet[Any]) -> QuerySet[Any]:
    return tokens.exclude(user__isnull=True, scope=REGISTRATION_SCOPE)


def scope_in_words(scope: str) -> str:
    words = [f"{name} ({SCOPE_WORDS[name]})" if name in SCOPE_WORDS else name for name in scope.split()]
    return "; ".join(words) or "none"


def may_revoke(request: HttpRequest, opts: Any) -> bool:
    """Revoking changes what a connected app may do: it takes the model's change permission (as revoking a bearer
    token does), though nothing here is edited; a staff user who may only view cannot cut anyone off."""
    return bool(request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}"))


class ReadOnlyAdmin(ConsoleList):
    def has_revoke_permission(self, request: HttpRequest) -> bool:
        """Who may use the revoke actions and pages (`permissions=["revoke"]`)."""
        return may_revoke(request, self.opts)

    view_on_site = False  # the toolkit's get_absolute_url names its own views, which are not served here

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def live_tokens_of(application: Application) -> QuerySet[AccessToken]:
    return (
        AccessToken.objects.filter(application=application, user__isnull=False, expires__gt=timezone.now())
        .select_related("user")
        .order_by("-created")
    )


@admin.register(ConnectedApp)
class ClientAdmin(ReadOnlyAdmin):
    # What tells apps apart, in cells that fit a 1280 px window (oauth.console_lists); the rest is on its page.
    list_display = ["app", "status", "users", "scope", "confinement_badges", "last_token", "expires"]
    list_filter = [AppSuspendedFilter, "registration_source", "client_type"]
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
    change_form_template = "admin/oauth/connectedapp/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Application]:
        refresh = RefreshToken.objects.filter(application=OuterRef("pk"), user__isnull=False)
        return (
            with_suspension(super().get_queryset(request))
            .select_related("sandstorm_registration")
            .prefetch_related("sandstorm_confinements", *live_tokens_prefetched(timezone.now()))
            .annotate(
                has_revoked_refresh=Exists(refresh.filter(revoked__isnull=False)),
                has_open_refresh=Exists(refresh.filter(revoked__isnull=True)),
            )
        )

    @admin.display(description="name", ordering="name")
    def app(self, obj: Application) -> str:
        return two_lines(obj.name or "(no name)", obj.client_id)

    @admin.display(description="status")
    def status(self, obj: Application) -> str:
        return status_badge(app_status(obj))

    @admin.display(description="users")
    def users(self, obj: Application) -> str:
        tokens = [*getattr(obj, "live_access", []), *getattr(obj, "live_refresh", [])]
        return ", ".join(sorted({token.user.get_username() for token in tokens})) or "—"

    @admin.display(description="scope")
    def scope(self, obj: Application) -> str:
        scopes = [token.scope for token in getattr(obj, "live_access", [])]
        scopes += [refresh.access_token.scope for refresh in getattr(obj, "live_refresh", [])]
        return " ".join(sorted({name for scope in scopes for name in scope.split()})) or "—"

    @admin.display(description="last token")
    def last_token(self, obj: Application) -> str:
        registration = getattr(obj, "sandstorm_registration", None)
        return moment(registration.last_token_at if registration else None, "never")

    @admin.display(description="expires")
    def expires(self, obj: Application) -> str:
        return access_ends(obj)

    @admin.display(description="confinement")
    def confinement_badges(self, obj: Application) -> str:
        """The profiles its users' full-scope calls get (no user's set: the installation's default); `host` warns."""
        choices = sorted({row.confinement for row in obj.sandstorm_confinements.all()} or {""})
        return format_html_join(" ", "{}", ((confinement.badge(choice, SCOPE_ALL),) for choice in choices))

    def may_revoke(self, request: HttpRequest) -> bool:
        return self.has_revoke_permission(request)

    # --- the connected app's page ----------------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [
            path("<path:object_id>/revoke/", self.admin_site.admin_view(self.revoke_view), name=f"{prefix}_revoke"),
            path("<path:object_id>/suspend/", self.suspension_view(SUSPEND), name=f"{prefix}_suspend"),
            path("<path:object_id>/resume/", self.suspension_view(RESUME), name=f"{prefix}_resume"),
            path(
                "<path:object_id>/confinement/",
                self.admin_site.admin_view(self.confinement_view),
                name=f"{prefix}_confinement",
            ),
        ]
        return own + super().get_urls()

    def suspension_view(self, action: str) -> Callable[..., HttpResponse]:
        """Suspend or resume the app, for every user or one (views/suspension.py): as revoking, the change
        permission."""

        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            application = self.get_object(request, unquote(object_id))
            if application is None:
                raise Http404("No such connected app.")
            if not self.may_revoke(request):
                raise PermissionDenied
            return app_suspension(self, request, application, action)

        return self.admin_site.admin_view(view)

    def app_detail(self, request: HttpRequest, application: Application) -> dict[str, Any]:
        calls = app_calls(application.name, application.client_id)
        recent = recent_calls(calls)
        tokens = list(live_tokens_of(application))
        # Each access token is a credential of its own in the audit log (a refresh makes a new one).
        seen: dict[str, str] = {}
        for token_id in [str(token.pk) for token in tokens] + list(calls[:200].values_list("credential_id", flat=True)):
            seen.setdefault(token_id, credential_audit_url(KIND_OAUTH, token_id))
        registration = getattr(application, "sandstorm_registration", None)
        return {
            "app": application,
            "app_label": application_label(application.name, application.client_id),
            "status_badge": status_badge(app_status(application)),
            "registration": registration,
            "approvals": approvals(application.client_id),
            "live_tokens": [{"token": token, "scope_words": scope_in_words(token.scope)} for token in tokens],
            "confinements": app_confinements(application),
            "confinement_choices": confinement.form_choices(agent_os_user()),
            "confinement_url": reverse("admin:oauth_connectedapp_confinement", args=[application.pk])
            if self.may_revoke(request)
            else "",
            "last_use": last_use(calls),
            "recent_calls": recent,
            "token_audit_links": list(seen.items())[:10],
            "audit_url": app_audit_url(application.name, application.client_id),
            "failed_yesterday_url": app_audit_url(
                application.name, application.client_id, outcome="failed", range="yesterday"
            ),
            "revoke_url": reverse("admin:oauth_connectedapp_revoke", args=[application.pk])
            if self.may_revoke(request)
            else "",
            **suspension_detail(application, app_user_ids(application), self.may_revoke(request)),
        }

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        application = self.get_object(request, unquote(object_id))
        if application is not None and self.has_view_permission(request, application):
            extra_context = {
                **(extra_context or {}),
                **self.app_detail(request, application),
                "title": f"Connected app “{application.name or application.client_id}”",
            }
        return super().change_view(request, object_id, form_url, extra_context)

    def confinement_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Change one user's profile of the app (POST from its page): the change permission, as revoking takes."""
        application = self.get_object(request, unquote(object_id))
        if application is None:
            raise Http404("No such connected app.")
        if not self.may_revoke(request):
            raise PermissionDenied
        app_url = reverse("admin:oauth_connectedapp_change", args=[application.pk])
        if request.method != "POST":
            return HttpResponseRedirect(app_url)
        form = AppConfinementForm(request.POST)
        user = None
        if form.is_valid() and form.cleaned_data["user"] in app_user_ids(application):
            user = get_user_model().objects.filter(pk=form.cleaned_data["user"]).first()
        if user is None:
            self.message_user(request, "Nothing changed: choose a profile for one of the app's users.", messages.ERROR)
            return HttpResponseRedirect(app_url)
        choice = form.cleaned_data["confinement"]
        changed = confinement.change_app_confinement(application, user, choice, request_actor(request))
        name = application.name or application.client_id
        state = "is now" if changed else "was already"
        self.message_user(
            request,
            f"The confinement of “{name}” for {user.get_username()} {state} {confinement.choice_label(choice)}; "
            "it applies from the app's next call.",
            messages.SUCCESS if changed else messages.INFO,
        )
        return HttpResponseRedirect(app_url)

    def revoke_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        application = self.get_object(request, unquote(object_id))
        if application is None:
            raise Http404("No such connected app.")
        if not self.may_revoke(request):
            raise PermissionDenied
        app_url = reverse("admin:oauth_connectedapp_change", args=[application.pk])
        back = return_url(request, app_url)  # the Live view's "Revoke credential" comes back to Live
        name = application.name or application.client_id
        if request.method == "POST":
            revoke_clients(Application.objects.filter(pk=application.pk), request_actor(request))
            self.message_user(request, CLIENT_REVOKED_MESSAGE.format(name=name), messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Revoke connected app “{name}”?",
            "app": application,
            "app_name": name,
            "live_tokens": live_tokens_of(application).count(),
            "running": running_count(app_calls(application.name, application.client_id)),
            "app_url": app_url,
            "back": back,
            "return_field": RETURN_FIELD,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/oauth/connectedapp/revoke.html", context)

    @admin.action(description="Revoke every token of the selected clients", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[Application]) -> None:
        count = revoke_clients(queryset, request_actor(request))
        self.message_user(
            request,
            f"Revoked the tokens of {count} client(s); their running tool calls were cancelled and their background processes are being stopped.",
            messages.SUCCESS,
        )

    @admin.action(description="Revoke and remove the selected clients", permissions=["revoke"])
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


@admin.register(ConnectedAppAccessToken)
class AccessTokenAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "application", "scope", "confinement_badge", "kind", "created", "expires"]
    list_filter = ["application"]
    search_fields = ["user__username", "application__name", "application__client_id"]
    fields = ["id", "user", "application", "scope", "resource", "created", "expires"]
    actions = ["revoke"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AccessToken]:
        # Its app's profile for its user in the same query (oauth.credentials reads it the same way).
        profile = AppConfinement.objects.filter(application=OuterRef("application"), user=OuterRef("user"))
        tokens = super().get_queryset(request).select_related("user", "application")
        return without_registration_tokens(tokens.annotate(app_confinement=Subquery(profile.values("confinement")[:1])))

    @admin.display(description="confinement")
    def confinement_badge(self, obj: AccessToken) -> str:
        return confinement.badge(getattr(obj, "app_confinement", None) or "", obj.scope)

    @admin.display(description="kind")
    def kind(self, obj: AccessToken) -> str:
        if obj.user_id is None:
            return "no user (refused)"
        return "expired" if obj.is_expired() else "access"

    @admin.action(description="Revoke the selected access tokens (with their refresh tokens)", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[AccessToken]) -> None:
        count = revoke_access_tokens(AccessToken.objects.filter(pk__in=queryset.values("pk")), request_actor(request))
        self.message_user(
            request,
            f"Revoked {count} access token(s) and their refresh-token families; the running tool calls and background processes of their clients are being stopped.",
            messages.SUCCESS,
        )


@admin.register(ConnectedAppRefreshToken)
class RefreshTokenAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "application", "token_family", "created", "revoked"]
    list_filter = [("revoked", admin.EmptyFieldListFilter), "application"]
    search_fields = ["user__username", "application__name", "application__client_id"]
    fields = ["id", "user", "application", "token_family", "created", "revoked"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[RefreshToken]:
        return super().get_queryset(request).select_related("user", "application")
