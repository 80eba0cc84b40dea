"""Housekeeping of self-registered OAuth clients."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Exists, OuterRef
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from audit.log import Actor, event
from oauth.credentials import application_label
from oauth.models import ClientRegistration

SELF_REGISTERED = (Application.RegistrationSource.DCR, Application.RegistrationSource.CIMD)


def unused_clients(older_than: timedelta) -> list[Application]:
    """Self-registered clients created before `older_than` ago that never obtained a token (a registration access
    token does not count) and hold no pending code."""
    cutoff = timezone.now() - older_than
    used = ClientRegistration.objects.filter(application=OuterRef("pk"), last_token_at__isnull=False)
    user_tokens = AccessToken.objects.filter(application=OuterRef("pk"), user__isnull=False)
    refresh_tokens = RefreshToken.objects.filter(application=OuterRef("pk"))
    grants = Grant.objects.filter(application=OuterRef("pk"))
    return list(
        Application.objects.filter(registration_source__in=SELF_REGISTERED, created__lt=cutoff)
        .filter(~Exists(used), ~Exists(user_tokens), ~Exists(refresh_tokens), ~Exists(grants))
        .order_by("pk")
    )


def prune_unused_clients(older_than: timedelta, by: Actor, *, dry_run: bool = False) -> list[str]:
    """Delete the unused clients (with their registration tokens), recording each. Returns their labels."""
    removed = []
    for application in unused_clients(older_than):
        label = application_label(application.name, application.client_id)
        removed.append(label)
        if not dry_run:
            event(
                "oauth.client_pruned",
                by,
                client_id=application.client_id,
                client=label,
                registered=application.created.isoformat(),
            )
            application.delete()
    return removed
