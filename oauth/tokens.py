"""Issuing and importing bearer tokens: the one place that creates BearerToken rows."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from oauth.models import SCOPE_ALL, BearerToken, hash_token, new_token_secret

BOOTSTRAP_NAME = "bootstrap"


def issue_token(user: AbstractBaseUser, name: str, *, scope: str = SCOPE_ALL, expires_days: int | None = None) -> tuple[BearerToken, str]:
    """Create a token and return it with its secret, which is not stored and cannot be shown again."""
    raw = new_token_secret()
    token = BearerToken(name=name, user=user, scope=scope)
    if expires_days is not None:
        token.expires_at = timezone.now() + timedelta(days=expires_days)
    token.set_secret(raw)
    token.save()
    return token, raw


def import_bootstrap_token(user: AbstractBaseUser, raw: str) -> bool:
    """Import SANDSTORM_MCP_TOKEN as the token named 'bootstrap'. True if a new row was made.

    Matching is by hash, so a revoked bootstrap token stays revoked while the variable still holds it.
    """
    if len(raw) < 16:
        raise ValueError("SANDSTORM_MCP_TOKEN must be at least 16 characters long")
    if BearerToken.objects.filter(token_hash=hash_token(raw)).exists():
        return False
    token = BearerToken(name=BOOTSTRAP_NAME, user=user, scope=SCOPE_ALL)
    token.set_secret(raw)
    try:
        with transaction.atomic():
            token.save()
    except IntegrityError:  # another process imported it at the same moment
        return False
    return True
