"""Admin-issued bearer tokens. Only a SHA-256 of each secret is stored; the secret is shown once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import models
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, RefreshToken
from oauth2_provider.settings import oauth2_settings

TOKEN_PREFIX = "sst_"
SCOPE_ALL = "mcp"
SCOPE_READ = "mcp:read"
SCOPE_CHOICES = [(SCOPE_ALL, "mcp: every tool"), (SCOPE_READ, "mcp:read: read-only tools")]
# What a scope lets an agent do, in one line (mcpserver.registry: the tools marked read_only, or read_only_when).
SCOPE_WORDS = {
    SCOPE_ALL: "every tool: run commands, write, move and delete files, install packages, git (clone, commit, push)",
    SCOPE_READ: "read-only tools: read files, list directories, git status, diff, log and branches, describe the host",
}
# Confinement profiles of full-scope credentials (oauth.confinement): "" leaves it to SANDSTORM_CONFINEMENT.
CONFINEMENT_INSTALLATION = ""
CONFINEMENT_WORKSPACE = "workspace"
CONFINEMENT_HOST = "host"
CONFINEMENT_CHOICES = [
    (CONFINEMENT_INSTALLATION, "the installation's default"),
    (CONFINEMENT_WORKSPACE, "workspace"),
    (CONFINEMENT_HOST, "host"),
]
# Writing last_used_at on every call would make each tool call a database write; a minute is precise enough.
LAST_USED_PRECISION = timedelta(minutes=1)


def hash_token(raw: str) -> str:
    # The secrets are 256-bit random values, so a plain SHA-256 is enough: there is nothing to brute-force.
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_token_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class BearerTokenQuerySet(models.QuerySet["BearerToken"]):
    def active(self, now: datetime | None = None) -> BearerTokenQuerySet:
        """Unrevoked and unexpired at `now` (by default the present)."""
        now = timezone.now() if now is None else now
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )

    def in_force(self, now: datetime | None = None) -> BearerTokenQuerySet:
        """The tokens that authenticate at `now` unless suspended (scope aside): active, of an active user.

        The lookup at /mcp runs this query (compiled to SQL once, oauth.bearer_lookup), so that a suspended token
        is told apart from an unknown one in the same query; `valid` is this without the suspended ones.
        """
        tokens = self.active(now)
        user_model = get_user_model()
        if any(field.name == "is_active" for field in user_model._meta.concrete_fields):
            tokens = tokens.filter(user__is_active=True)  # AbstractBaseUser has no such column: always active
        return tokens

    def valid(self, now: datetime | None = None) -> BearerTokenQuerySet:
        """The tokens that authenticate at `now` (scope aside): in force and not suspended.

        The one definition: the lookup at /mcp accepts what it finds in force only if it is not suspended, and its
        event-loop shortcut (oauth.steady_tokens) runs this query, compiled to SQL once (oauth.bearer_lookup).
        """
        return self.in_force(now).filter(suspended_at__isnull=True)


class BearerToken(models.Model):
    name = models.CharField(max_length=100, help_text="What this token is for, e.g. 'claude-code on laptop'.")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="bearer_tokens",
        help_text="Who the agent acts as.",
    )
    scope = models.CharField(max_length=20, choices=SCOPE_CHOICES, default=SCOPE_ALL)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="The first characters, to recognise a token.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Set while an admin has it suspended: refused at /mcp (saying so) until resumed; nothing else changes.
    suspended_at = models.DateTimeField(null=True, blank=True, editable=False)
    confinement = models.CharField(
        max_length=12,
        choices=CONFINEMENT_CHOICES,
        default=CONFINEMENT_INSTALLATION,
        blank=True,
        help_text="What the agent's commands may reach (full scope only); empty: the installation's default.",
    )

    objects = BearerTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "bearer token"
        constraints = [
            # An expired token keeps its name until it is revoked: it still has a page, an audit trail and a row.
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(revoked_at__isnull=True), name="oauth_bearer_active_name"
            )
        ]

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

    @property
    def status(self) -> str:
        """ "active", "suspended", "expired" or "revoked" (an expired token cannot be resumed into use)."""
        if self.revoked_at is not None:
            return "revoked"
        if not self.is_active:
            return "expired"
        return "active" if self.suspended_at is None else "suspended"


class ClientRegistration(models.Model):
    """How a self-registered OAuth client came to be (DCR or CIMD), from where, and when it last got a token.

    The toolkit's Application row knows none of this; the consent page warns about clients registered minutes ago,
    registrations are rate-limited per address, and `prune_clients` removes clients that never got a token.
    """

    SOURCE_DCR = "dcr"
    SOURCE_CIMD = "cimd"

    application = models.OneToOneField(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="sandstorm_registration"
    )
    source = models.CharField(
        max_length=8, choices=[(SOURCE_DCR, "dynamic registration"), (SOURCE_CIMD, "metadata document")]
    )
    client_address = models.CharField(max_length=64, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    registered_at = models.DateTimeField(default=timezone.now)
    last_token_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["client_address", "registered_at"], name="oauth_reg_address_time")]

    def __str__(self) -> str:
        return f"registration of {self.application_id} from {self.client_address or 'unknown address'}"


class AppConfinement(models.Model):
    """The confinement profile of a connected app for one user: the credential oauth.credentials.oauth_key names,
    which outlives each access token (a refresh makes a new one). No row: the installation's default."""

    application = models.ForeignKey(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="sandstorm_confinements"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    confinement = models.CharField(
        max_length=12, choices=CONFINEMENT_CHOICES, default=CONFINEMENT_INSTALLATION, blank=True
    )
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "connected-app confinement"
        constraints = [models.UniqueConstraint(fields=["application", "user"], name="oauth_app_confinement_once")]

    def __str__(self) -> str:
        return f"confinement of application {self.application_id} for user {self.user_id}"


class AppSuspension(models.Model):
    """A connected app suspended by an admin, for one user or (no user) for all of them: its access tokens are
    refused at /mcp, saying so, until the row is removed (resumed); its tokens and grants are kept. The access-token
    lookup reads it in the same query (oauth.credentials)."""

    application = models.ForeignKey(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="sandstorm_suspensions"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+",
        help_text="Empty: the app is suspended for every user.",
    )  # fmt: skip
    suspended_at = models.DateTimeField(default=timezone.now)
    username = models.CharField(max_length=150, blank=True, help_text="who suspended it")

    class Meta:
        verbose_name = "connected-app suspension"
        constraints = [
            models.UniqueConstraint(
                fields=["application"], condition=models.Q(user__isnull=True), name="oauth_app_suspended_once"
            ),
            models.UniqueConstraint(
                fields=["application", "user"],
                condition=models.Q(user__isnull=False),
                name="oauth_app_user_suspended_once",
            ),
        ]

    def __str__(self) -> str:
        whom = f"user {self.user_id}" if self.user_id is not None else "every user"
        return f"suspension of application {self.application_id} for {whom}"


class CodeExchange(models.Model):
    """Which tokens an authorization code was exchanged for: the link the toolkit drops when it deletes a used code,
    kept so that a replayed code revokes what it produced (RFC 6749 section 4.1.2)."""

    code_hash = models.CharField(max_length=64, unique=True)
    application = models.ForeignKey(oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, related_name="+")
    token_family = models.UUIDField(null=True, blank=True)
    access_token_id = models.BigIntegerField(null=True, blank=True)
    exchanged_at = models.DateTimeField(default=timezone.now)
    replayed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"code exchange {self.pk}"


class Revocation(models.Model):
    """Credentials revoked (or suspended) at one moment, by principal key (`bearer:<id>`,
    `oauth:<application>:<user>`) or, for a rotation or a whole app, by key prefix.

    Tool calls started before this moment by those keys are cancelled and, if asked, background processes they
    started are stopped.
    The row is how the server learns about a revocation made by another process (`manage.py rotate_tokens`).
    """

    REASON_ROTATION = "rotation"
    REASON_BEARER = "bearer"
    REASON_CLIENT = "client"
    REASON_TOKEN = "token"
    REASON_CODE_REPLAY = "code_replay"
    REASON_REFRESH_REUSE = "refresh_reuse"
    # A bearer token given a new secret (the old one revoked); a credential suspended by an admin, which revokes
    # nothing: the row only cancels its running calls (and, if asked, stops its background processes).
    REASON_REGENERATION = "regeneration"
    REASON_SUSPENSION = "suspension"

    created_at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=16)
    keys = models.JSONField(default=list, help_text="principal keys whose running calls are cancelled")
    prefixes = models.JSONField(default=list, help_text="key prefixes revoked as a whole ('oauth:', 'bearer:')")
    stop_background = models.BooleanField(default=False)
    username = models.CharField(max_length=150, blank=True, help_text="who revoked")

    class Meta:
        ordering = ["-id"]
        verbose_name = "credential revocation"

    def __str__(self) -> str:
        what = ", ".join(f"all {prefix.rstrip(':')}" for prefix in self.prefixes) or f"{len(self.keys)} credential(s)"
        return f"{self.reason} at {self.created_at:%Y-%m-%d %H:%M:%S} ({what})"

    def covers(self, key: str) -> bool:
        return key in self.keys or any(key.startswith(prefix) for prefix in self.prefixes)


class CredentialRotation(Revocation):
    """The admin's "Rotate all credentials" page (and its history), listed on the admin index under Credentials."""

    class Meta:
        proxy = True
        verbose_name = "credential rotation"
        verbose_name_plural = "Rotate all credentials"


class LoginFailure(models.Model):
    """A failed admin login, counted to throttle guessing (oauth/throttle.py): by username as authentication
    normalises it (case-folded) and by address (an IPv6 address by its /64)."""

    client_address = models.CharField(max_length=64, blank=True)
    username = models.CharField(max_length=150, blank=True)
    failed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["client_address", "failed_at"], name="oauth_loginfail_address"),
            models.Index(fields=["username", "failed_at"], name="oauth_loginfail_username"),
        ]

    def __str__(self) -> str:
        return f"failed login {self.username!r} from {self.client_address}"


class KnownLoginAddress(models.Model):
    """An address a user signed in from with the right password: there, failures from elsewhere never slow that
    user's sign-in (oauth/throttle.py). Stored as a keyed hash of username and address, never the address."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    digest = models.CharField(max_length=64, unique=True)
    last_login_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"known sign-in address of user {self.user_id}"


# The toolkit's models as this app's "Connected apps": proxies, so the admin lists them under Credentials with
# names of ours (an app's section title is its verbose_name, which the toolkit's own app config fixes).
class ConnectedApp(Application):
    class Meta:
        proxy = True
        verbose_name = "connected app"

    def get_absolute_url(self) -> str:
        # The toolkit's own points at its management views, which this project does not serve.
        from django.urls import reverse

        return reverse("admin:oauth_connectedapp_change", args=[self.pk])


class ConnectedAppAccessToken(AccessToken):
    class Meta:
        proxy = True
        verbose_name = "connected-app access token"


class ConnectedAppRefreshToken(RefreshToken):
    class Meta:
        proxy = True
        verbose_name = "connected-app refresh token"
