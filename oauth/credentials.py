"""Turn the credential presented at /mcp into a principal: who is calling, with what, allowed to do what."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.db.models import F
from django.utils import timezone

from audit.recorder import Actor, event
from oauth.models import LAST_USED_PRECISION, SCOPE_ALL, SCOPE_READ, BearerToken, hash_token

MCP_SCOPES = frozenset({SCOPE_ALL, SCOPE_READ})


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
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> str:
        """Stable id of the credential, for rate limits and session ownership."""
        return f"{self.credential_kind}:{self.credential_id}"

    @property
    def read_only(self) -> bool:
        return SCOPE_ALL not in self.scopes

    @property
    def scope_text(self) -> str:
        return " ".join(sorted(self.scopes))


def _lookup_bearer(raw: str, client_address: str = "") -> BearerToken | None:
    digest = hash_token(raw)
    token = BearerToken.objects.select_related("user").filter(token_hash=digest).first()
    # The lookup is by an index on the hash; compare again in constant time so no timing depends on the secret.
    if token is None or not hmac.compare_digest(token.token_hash, digest):
        return None
    if not token.is_active or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None:
        # Only one request wins the first use, however many arrive at once.
        if BearerToken.objects.filter(pk=token.pk, last_used_at__isnull=True).update(last_used_at=now):
            event("token.first_used", Actor(client_address=client_address), token_id=token.pk, name=token.name, prefix=token.prefix)
    elif now - token.last_used_at > LAST_USED_PRECISION:
        BearerToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
    return token


async def authenticate_bearer(raw: str, *, client_address: str = "", user_agent: str = "") -> Principal | None:
    """The principal for an admin-issued bearer token, or None if it is unknown, revoked or expired."""
    if not raw or len(raw) > 512:
        return None
    token = await sync_to_async(_lookup_bearer, thread_sensitive=False)(raw, client_address)
    if token is None:
        return None
    scopes = token.scopes & MCP_SCOPES
    if not scopes:
        return None
    return Principal(
        user_id=token.user_id,
        username=token.user.get_username(),
        credential_kind="bearer",
        credential_id=token.pk,
        credential_name=token.name,
        scopes=frozenset(scopes),
        client_address=client_address,
        user_agent=user_agent,
    )
