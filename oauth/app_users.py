"""The users a connected app acts as, and each one's confinement profile of it, as the app's page shows and changes
them (oauth.admin_clients)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, RefreshToken

from oauth import confinement
from oauth.agent_identity import agent_os_user
from oauth.models import SCOPE_ALL, AppConfinement


class AppConfinementForm(forms.Form):
    """One user's confinement profile of a connected app, as the app's page posts it."""

    user = forms.IntegerField(min_value=1)
    confinement = forms.ChoiceField(choices=[(choice, choice) for choice in confinement.CHOICES], required=False)


def app_user_ids(application: Application) -> set[int]:
    """The users a connected app acts as: those with a live access token or an unrevoked refresh token, and those
    whose profile of it was set."""
    now = timezone.now()
    ids = set(AccessToken.objects.filter(application=application, user__isnull=False, expires__gt=now).values_list(
        "user_id", flat=True))  # fmt: skip
    ids |= set(RefreshToken.objects.filter(application=application, user__isnull=False, revoked__isnull=True)
               .values_list("user_id", flat=True))  # fmt: skip
    ids |= set(AppConfinement.objects.filter(application=application).values_list("user_id", flat=True))
    return ids


def app_confinements(application: Application) -> list[dict[str, Any]]:
    """Each user's profile of a connected app, for its page."""
    chosen = dict(AppConfinement.objects.filter(application=application).values_list("user_id", "confinement"))
    users = get_user_model().objects.filter(pk__in=app_user_ids(application)).order_by("pk")
    agent = agent_os_user()
    return [
        {
            "user": user,
            "choice": chosen.get(user.pk, ""),
            "badge": confinement.badge(chosen.get(user.pk, ""), SCOPE_ALL),
            "line": confinement.reach_words(chosen.get(user.pk, ""), SCOPE_ALL, agent),
            "note": confinement.enforcement_note(chosen.get(user.pk, ""), SCOPE_ALL),
        }
        for user in users
    ]
