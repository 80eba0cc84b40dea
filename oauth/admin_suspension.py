"""What a connected app's page and list show of its suspensions (oauth.suspension): the app's status, a filter of
the list, and each user's suspension with the links to suspend or resume it (oauth/views/suspension.py)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.http import urlencode
from oauth2_provider.models import Application

from oauth.models import AppSuspension
from oauth.session_links import app_sessions
from oauth.suspension import suspended_users


def with_suspension(applications: QuerySet[Application]) -> QuerySet[Application]:
    """`suspended_for_everyone` on each app, in the list's query."""
    every = AppSuspension.objects.filter(application=OuterRef("pk"), user__isnull=True)
    return applications.annotate(suspended_for_everyone=Exists(every))


class AppSuspendedFilter(admin.SimpleListFilter):
    title = "suspended"
    parameter_name = "suspended"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [("every", "for every user"), ("some", "for some users"), ("no", "no")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Application]) -> QuerySet[Application]:
        any_user = Exists(AppSuspension.objects.filter(application=OuterRef("pk"), user__isnull=False))
        every = Exists(AppSuspension.objects.filter(application=OuterRef("pk"), user__isnull=True))
        chosen = {"every": every, "some": any_user & ~every, "no": ~any_user & ~every}.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen)


def action_url(application: Application, action: str, user_id: int | None = None) -> str:
    url = reverse(f"admin:oauth_connectedapp_{action}", args=[application.pk])
    return f"{url}?{urlencode({'user': user_id})}" if user_id is not None else url


def suspension_detail(application: Application, user_ids: set[int], may_change: bool) -> dict[str, Any]:
    """The app's suspension for every user and each user's, with the links to change them (if `may_change`)."""
    every, each = suspended_users(application)
    users = get_user_model().objects.filter(pk__in=user_ids | set(each)).order_by("pk")
    rows = [
        {
            "user": user,
            "suspension": each.get(user.pk),
            "url": action_url(application, "resume" if user.pk in each else "suspend", user.pk) if may_change else "",
        }
        for user in users
    ]
    return {
        "suspended_for_everyone": every,
        "user_suspensions": rows,
        "suspend_url": action_url(application, "suspend") if may_change and every is None else "",
        "resume_url": action_url(application, "resume") if may_change and every is not None else "",
        "sessions": app_sessions(application.pk),
    }
