"""Admin-issued bearer tokens. Only a SHA-256 of each secret is stored; the secret is shown once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "sst_"
SCOPE_ALL = "mcp"
SCOPE_READ = "mcp:read"
SCOPE_CHOICES = [(SCOPE_ALL, "mcp: every tool"), (SCOPE_READ, "mcp:read: read-only tools")]
# Writing last_used_at on every call would make each tool call a database write; a minute is precise enough.
LAST_USED_PRECISION = timedelta(minutes=1)


def hash_token(raw: str) -> str:
    # The secrets are 256-bit random values, so a plain SHA-256 is enough: there is nothing to brute-force.
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_token_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class BearerTokenQuerySet(models.QuerySet["BearerToken"]):
    def active(self) -> BearerTokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now))


class BearerToken(models.Model):
    name = models.CharField(max_length=100, help_text="What this token is for, e.g. 'claude-code on laptop'.")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bearer_tokens", help_text="Who the agent acts as."
    )
    scope = models.CharField(max_length=20, choices=SCOPE_CHOICES, default=SCOPE_ALL)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="The first characters, to recognise a token.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = BearerTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "bearer token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def set_secret(self, raw: str) -> None:
        self.token_hash = hash_token(raw)
        self.prefix = raw[: len(TOKEN_PREFIX) + 4]

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    @property
    def scopes(self) -> frozenset[str]:
        return frozenset(self.scope.split())
