"""Turn the credential presented at /mcp into a principal: who is calling, with what, allowed to do what.

Two kinds of credential reach /mcp: admin-issued bearer tokens (`sst_…`) and OAuth access tokens issued by this
server's authorization server. An OAuth access token is accepted only if it is unexpired and unrevoked, belongs
to a user and an application, is bound to exactly our resource (`<public url>/mcp`) and carries `mcp` or
`mcp:read`. Registration tokens and tokens without our resource are refused like unknown tokens (401); a valid
token for our resource without an MCP scope raises InsufficientScope (403 at the endpoint); a credential an admin
suspended (a bearer token, or a connected app for every user or for this one) raises CredentialSuspended (403,
saying so), found by the same query that finds the token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Exists, Model, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone
from oauth2_provider.models import AccessToken

from audit.log import Actor, event
from oauth.bearer_lookup import CompiledLookup, compile_bearer_in_force
from oauth.models import (
    LAST_USED_PRECISION,
    SCOPE_ALL,
    SCOPE_READ,
    AppConfinement,
    AppSuspension,
    BearerToken,
    hash_token,
)
from oauth.steady_tokens import SteadyToken, SteadyTokens

MCP_SCOPES = frozenset({SCOPE_ALL, SCOPE_READ})
KIND_BEARER = "bearer"
KIND_OAUTH = "oauth"
MAX_TOKEN_LENGTH = 512
T = TypeVar("T", bound=Model)


class InsufficientScope(Exception):
    """A valid OAuth access token for our resource that carries neither `mcp` nor `mcp:read`."""


class CredentialSuspended(Exception):
    """A credential that would be accepted but that an admin suspended (oauth.suspension); `kind` is KIND_BEARER or
    KIND_OAUTH. Raised before its use is recorded: a refused request is not a use."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(f"this {kind} credential is suspended by an administrator")


def bearer_key(token_id: int) -> str:
    return f"{KIND_BEARER}:{token_id}"


def oauth_key(application_id: int, user_id: int) -> str:
    # Per application and user, not per access token: a client refreshing its token keeps its MCP session, its
    # rate-limit window and its running calls.
    return f"{KIND_OAUTH}:{application_id}:{user_id}"


def app_key_prefix(application_id: int) -> str:
    """What the principal keys of an OAuth application, for every user, start with."""
    return f"{KIND_OAUTH}:{application_id}:"


@dataclass(frozen=True)
class Principal:
    """The identity behind one request at /mcp. Never holds the secret itself."""

    user_id: int
    username: str
    credential_kind: str  # "bearer" (admin-issued token) or "oauth" (access token of an OAuth application)
    credential_id: int
    credential_name: str
    scopes: frozenset[str]
    client_address: str = ""
    user_agent: str = ""
    application_id: int | None = None  # the OAuth application, for "oauth" principals
    # The credential's own confinement profile ("workspace" or "host"), or "" for the installation's default
    # (oauth.confinement; the call path resolves it against the setting and what the kernel can enforce).
    confinement: str = ""

    @property
    def key(self) -> str:
        """Stable id of the credential, for rate limits, session ownership and cancellation on revocation."""
        if self.credential_kind == KIND_OAUTH and self.application_id is not None:
            return oauth_key(self.application_id, self.user_id)
        return f"{self.credential_kind}:{self.credential_id}"

    @property
    def read_only(self) -> bool:
        return SCOPE_ALL not in self.scopes

    @property
    def scope_text(self) -> str:
        return " ".join(sorted(self.scopes))


def _one(queryset: QuerySet[T]) -> T | None:
    """The row of a lookup by a unique column. Not .first(): it orders by the primary key, needless for one row."""
    for row in queryset.order_by()[:1]:
        return row
    return None


def _lookup_bearer(lookup: CompiledLookup, alias: str, raw: str, client_address: str) -> SteadyToken | None:
    """The valid token for `raw` (BearerToken.objects.valid), as (id, name, scope, user id, username, confinement);
    records its use (the first, or one after LAST_USED_PRECISION). Raises CredentialSuspended for a token in force
    that an admin suspended."""
    digest = hash_token(raw)
    now = timezone.now()
    token = next(iter(BearerToken.objects.db_manager(alias).raw(lookup.sql, lookup.params(digest, now))), None)
    # The lookup is by an index on the hash; compare again in constant time so no timing depends on the secret.
    if token is None or not hmac.compare_digest(token.token_hash, digest):
        return None
    if token.suspended_at is not None:
        raise CredentialSuspended(KIND_BEARER)
    tokens = BearerToken.objects.using(alias).filter(pk=token.pk)
    if token.last_used_at is None:
        # Only one request wins the first use, however many arrive at once.
        if tokens.filter(last_used_at__isnull=True).update(last_used_at=now):
            event(
                "token.first_used",
                Actor(client_address=client_address),
                token_id=token.pk,
                name=token.name,
                prefix=token.prefix,
            )
    elif now - token.last_used_at > LAST_USED_PRECISION:
        tokens.update(last_used_at=now)
    username = vars(token)["user_username"]  # the query's annotation
    return token.pk, token.name, token.scope, token.user_id, username, token.confinement


def _lookup_oauth(raw: str) -> AccessToken | None:
    """The access token for `raw` if it may be used at /mcp at all (scope aside), else None. Raises
    CredentialSuspended for one an admin suspended."""
    checksum = hashlib.sha256(raw.encode("utf-8")).hexdigest()
    # The connected app's confinement for this user, and whether an admin suspended the app for every user or for
    # this one, come in the same query (no row: the installation's default; not suspended).
    profile = AppConfinement.objects.filter(application=OuterRef("application"), user=OuterRef("user"))
    suspension = AppSuspension.objects.filter(application=OuterRef("application")).filter(
        Q(user__isnull=True) | Q(user=OuterRef("user"))
    )
    token = _one(
        AccessToken.objects.select_related("user", "application")
        .annotate(app_confinement=Subquery(profile.values("confinement")[:1]), app_suspended=Exists(suspension))
        .filter(token_checksum=checksum)
    )
    if token is None or not hmac.compare_digest(token.token_checksum, checksum) or token.is_expired():
        return None
    # No user: a client_credentials or registration token. No application: an introspection cache row.
    if token.user is None or not token.user.is_active or token.application is None:
        return None
    # Exactly our resource, compared as strings: the toolkit's own check matches by prefix and lets tokens
    # without a resource through.
    if token.resource != [settings.MCP_RESOURCE_URL]:
        return None
    if getattr(token, "app_suspended", False):
        raise CredentialSuspended(KIND_OAUTH)
    return token


def application_label(name: str, client_id: str) -> str:
    """How the audit log names an OAuth client: its (self-chosen) name and its client id."""
    return f"{name or 'unnamed client'} (client {client_id})"[:200]


def _bearer_principal(token: SteadyToken, client_address: str, user_agent: str) -> Principal | None:
    token_id, name, scope, user_id, username, confinement = token
    scopes = frozenset(scope.split()) & MCP_SCOPES
    if not scopes:
        return None
    return Principal(
        user_id=user_id,
        username=username,
        credential_kind=KIND_BEARER,
        credential_id=token_id,
        credential_name=name,
        scopes=scopes,
        client_address=client_address,
        user_agent=user_agent,
        confinement=confinement,
    )


def _oauth_principal(raw: str, client_address: str, user_agent: str) -> Principal | None:
    token = _lookup_oauth(raw)
    if token is None:
        return None
    scopes = frozenset(token.scope.split()) & MCP_SCOPES
    if not scopes:
        raise InsufficientScope()
    application = token.application
    assert application is not None and token.user is not None  # checked by _lookup_oauth
    return Principal(
        user_id=token.user.pk,
        username=token.user.get_username(),
        credential_kind=KIND_OAUTH,
        credential_id=token.pk,
        credential_name=application_label(application.name, application.client_id),
        scopes=scopes,
        client_address=client_address,
        user_agent=user_agent,
        application_id=application.pk,
        confinement=getattr(token, "app_confinement", None) or "",
    )


class Authenticator:
    """The principal for the token presented at /mcp; built at start-up by `build_authenticator`."""

    def __init__(self, alias: str, steady: SteadyTokens | None) -> None:
        self._alias = alias
        self._bearer_in_force = compile_bearer_in_force(connections[alias])
        self._steady = steady
        # Lookups run on two threads of their own, each keeping its database connection open, rather than through
        # asgiref's sync_to_async (a set-up per call, and threads of a shared pool taking turns); two, so a lookup
        # that must record a first use does not hold up the others.
        self._lookups = ThreadPoolExecutor(max_workers=2, thread_name_prefix="credential-lookup")

    @property
    def checks_steady_tokens(self) -> bool:
        """Whether bearer tokens in steady use are checked on the caller's thread (oauth.steady_tokens)."""
        return self._steady is not None

    async def __call__(self, raw: str, *, client_address: str = "", user_agent: str = "") -> Principal | None:
        """The principal for a bearer or OAuth access token, or None if it is unknown, revoked, expired or not
        for us.

        Raises InsufficientScope for an OAuth token that is valid for our resource but carries no MCP scope, and
        CredentialSuspended for a credential an admin suspended.
        """
        if not raw or len(raw) > MAX_TOKEN_LENGTH:
            return None
        steady = self._steady.find(raw) if self._steady is not None else None
        if steady is not None and (principal := _bearer_principal(steady, client_address, user_agent)) is not None:
            return principal
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._lookups, self.principal_for, raw, client_address, user_agent)

    def principal_for(self, raw: str, client_address: str, user_agent: str) -> Principal | None:
        """The authoritative lookup (blocking): what `__call__` answers when the shortcut does not."""
        bearer = _lookup_bearer(self._bearer_in_force, self._alias, raw, client_address)
        if bearer is not None:
            return _bearer_principal(bearer, client_address, user_agent)
        return _oauth_principal(raw, client_address, user_agent)

    def close(self) -> None:
        self._lookups.shutdown(wait=True)
        if self._steady is not None:
            self._steady.close()


def build_authenticator(alias: str = DEFAULT_DB_ALIAS, *, steady: bool | None = None) -> Authenticator:
    """The authenticator for the database `alias`. `steady`: check bearer tokens in steady use on the caller's
    thread (oauth.steady_tokens); None: on SQLite, where a read never waits for a writer, and nowhere else."""
    if steady is None:
        steady = connections[alias].vendor == "sqlite"
    return Authenticator(alias, SteadyTokens(alias) if steady else None)
