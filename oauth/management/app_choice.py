"""Which connected app, and which of its users, a command's arguments name: a client id (or the app's id, as the
admin's address shows it) and, optionally, a username."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.management.base import CommandError
from oauth2_provider.models import Application


def choose_app(key: str) -> Application:
    application = Application.objects.filter(client_id=key).first()
    if application is None and key.isdigit():
        application = Application.objects.filter(pk=int(key)).first()
    if application is None:
        raise CommandError(f"no connected app has the client id (or id) {key!r}")
    return application


def choose_user(username: str | None) -> AbstractBaseUser | None:
    """The user named `username`; None (every user) if no name is given."""
    if username is None:
        return None
    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    if user is None:
        raise CommandError(f"no user named {username!r}")
    return user
