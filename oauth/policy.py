"""The policy django-oauth-toolkit lacks, as overrides of its request validator (OAUTH2_VALIDATOR_CLASS).

- Resource: every grant and token is bound to exactly `<public url>/mcp`. Another resource gets `invalid_target`;
  no resource gets ours. (The toolkit accepts any resource and lets unbound tokens pass its prefix check.)
- Redirect URIs: https, or http only to loopback, checked on every authorization request.
- Codes: consumed in the same transaction that stores the tokens (so two concurrent exchanges cannot both
  succeed), and linked to the tokens they produced, so that a replayed code revokes them.
- Clients: a client that obtained a token is marked used (for `prune_clients`); a CIMD client seen for the first
  time is recorded and audited like a dynamic registration.
- Suspended apps (oauth.suspension): a code or refresh token of an app suspended for every user or for its user is
  refused with `invalid_grant` saying so, once the toolkit has found it valid and before anything is rotated or
  consumed, so the same refresh token works again once the app is resumed.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.common import Request
from oauthlib.oauth2.rfc6749 import errors

from audit.log import Actor, event
from oauth.credentials import application_label, oauth_key
from oauth.models import ClientRegistration, CodeExchange, Revocation
from oauth.redirects import redirect_uri_refusal
from oauth.revocation import announce, code_hash, revoke_tokens_of_replayed_code
from oauth.suspension import suspension_of

logger = logging.getLogger(__name__)
CODE_CONSUMED = "_sandstorm_code_consumed"
# RFC 6749's error_description: printable ASCII without '"' or '\'.
SUSPENDED_DESCRIPTION = (
    "This app is suspended by an administrator of this Sandstorm server: it gets no new tokens until an "
    "administrator resumes it. Nothing was revoked."
)
REFUSALS_RECORDED_EVERY = 60  # seconds: one audit record per app, user and grant type


def resource_target_error(
    resources: list[str], request: Request | None = None, state: str | None = None
) -> errors.CustomOAuth2Error | None:
    """The `invalid_target` error if `resources` names anything but our resource, else None."""
    ours = settings.MCP_RESOURCE_URL
    for resource in resources:
        if resource != ours:
            return errors.CustomOAuth2Error(
                error="invalid_target",
                description=f"This server issues tokens only for the resource {ours}",
                request=request,
                state=state,
            )
    return None


def client_address(request: Request) -> str:
    return str(request.headers.get("REMOTE_ADDR", "") or "")[:64]


def refuse_if_suspended(client: Application, request: Request) -> None:
    """Raise `invalid_grant` if an admin suspended `client` for every user or for the grant's user (set on `request`
    by the toolkit's check of the code or refresh token): a suspended app gets no new tokens, and nothing of it is
    revoked or used up, so it goes on once resumed. Each refusal is audited, at most once a minute per app, user and
    grant type (a client retrying in a loop would otherwise fill the log)."""
    user = getattr(request, "user", None)
    user_id = user.pk if user is not None else None
    suspension = suspension_of(client, user_id)
    if suspension is None:
        return
    if cache.add(f"sandstorm:oauth-refused:{client.pk}:{user_id}:{request.grant_type}", True, REFUSALS_RECORDED_EVERY):
        event(
            "oauth.token_refused",
            Actor(client_address=client_address(request)),
            client_id=client.client_id,
            client=application_label(client.name, client.client_id),
            owner=user.get_username() if user is not None else "",
            grant_type=request.grant_type,
            reason="suspended",
            for_every_user=suspension.user_id is None,
        )
    raise errors.InvalidGrantError(description=SUSPENDED_DESCRIPTION, request=request)


class SandstormValidator(OAuth2Validator):
    # --- resource (RFC 8707) ------------------------------------------------------------------------------------
    def _bind_resource(self, request: Request) -> None:
        resources = list(getattr(request, "resource", None) or [])
        error = resource_target_error(resources, request)
        if error is not None:
            raise error
        request.resource = [settings.MCP_RESOURCE_URL]

    def _create_authorization_code(self, request: Request, code: dict[str, Any], expires: Any = None) -> Grant:
        self._bind_resource(request)
        return super()._create_authorization_code(request, code, expires)

    def _check_and_set_request_resource(self, request: Request) -> None:
        super()._check_and_set_request_resource(request)
        self._bind_resource(request)

    # --- redirect URIs --------------------------------------------------------------------------------------------
    def validate_redirect_uri(
        self, client_id: str, redirect_uri: str, request: Request, *args: Any, **kwargs: Any
    ) -> bool:
        if redirect_uri_refusal(redirect_uri) is not None:
            return False
        return bool(super().validate_redirect_uri(client_id, redirect_uri, request, *args, **kwargs))

    def get_default_redirect_uri(self, client_id: str, request: Request, *args: Any, **kwargs: Any) -> str | None:
        uri = super().get_default_redirect_uri(client_id, request, *args, **kwargs)
        return uri if uri and redirect_uri_refusal(uri) is None else None

    # --- codes: single use, and replay revokes what the code produced ----------------------------------------------
    def validate_code(
        self, client_id: str, code: str, client: Application, request: Request, *args: Any, **kwargs: Any
    ) -> bool:
        if super().validate_code(client_id, code, client, request, *args, **kwargs):
            refuse_if_suspended(client, request)  # the code is kept: it works if the app is resumed within its life
            return True
        if revoke_tokens_of_replayed_code(code, client, client_address(request)):
            logger.warning("authorization code of client %s replayed; its tokens were revoked", client.client_id)
        return False

    def save_bearer_token(self, token: dict[str, Any], request: Request, *args: Any, **kwargs: Any) -> None:
        try:
            with transaction.atomic():
                super().save_bearer_token(token, request, *args, **kwargs)
                if request.grant_type == "authorization_code":
                    self._consume_code(token, request)
                ClientRegistration.objects.filter(application=request.client).update(last_token_at=timezone.now())
        except errors.InvalidGrantError:
            if request.grant_type == "authorization_code":
                # Another exchange of the same code won the race: what it got is revoked too.
                revoke_tokens_of_replayed_code(request.code, request.client, client_address(request))
            raise

    def _consume_code(self, token: dict[str, Any], request: Request) -> None:
        """Delete the code in the transaction that stored its tokens, and remember which tokens they were."""
        deleted, _ = Grant.objects.filter(code=request.code, application=request.client).delete()
        if not deleted:
            raise errors.InvalidGrantError(request=request)
        setattr(request, CODE_CONSUMED, True)
        refresh = token.get("refresh_token")
        family = None
        if refresh:
            refresh_checksum = hashlib.sha256(refresh.encode("utf-8")).hexdigest()
            family = (
                RefreshToken.objects.filter(token_checksum=refresh_checksum)
                .values_list("token_family", flat=True)
                .first()
            )
        access_checksum = hashlib.sha256(token["access_token"].encode("utf-8")).hexdigest()
        access_id = AccessToken.objects.filter(token_checksum=access_checksum).values_list("pk", flat=True).first()
        CodeExchange.objects.create(
            code_hash=code_hash(request.code),
            application=request.client,
            user=request.user,
            token_family=family,
            access_token_id=access_id,
        )

    def invalidate_authorization_code(
        self, client_id: str, code: str, request: Request, *args: Any, **kwargs: Any
    ) -> None:
        if getattr(request, CODE_CONSUMED, False):
            return  # already deleted by _consume_code, in the transaction that stored the tokens
        super().invalidate_authorization_code(client_id, code, request, *args, **kwargs)

    # --- refresh-token reuse ----------------------------------------------------------------------------------------
    def validate_refresh_token(
        self, refresh_token: str, client: Application, request: Request, *args: Any, **kwargs: Any
    ) -> bool:
        valid = bool(super().validate_refresh_token(refresh_token, client, request, *args, **kwargs))
        if valid:
            refuse_if_suspended(client, request)  # before the rotation: the same refresh token works once resumed
        else:
            checksum = hashlib.sha256(refresh_token.encode("utf-8")).hexdigest()
            reused = (
                RefreshToken.objects.filter(token_checksum=checksum, revoked__isnull=False)
                .select_related("application")
                .first()
            )
            if reused is not None:
                # The toolkit has just revoked the whole family (REFRESH_TOKEN_REUSE_PROTECTION): a revocation like
                # any other, so the client's running calls are cancelled and its background processes stopped.
                event(
                    "oauth.refresh_reused",
                    Actor(client_address=client_address(request)),
                    client_id=reused.application.client_id,
                    client=application_label(reused.application.name, reused.application.client_id),
                    user_id=reused.user_id,
                )
                announce(
                    [oauth_key(reused.application_id, reused.user_id)], reason=Revocation.REASON_REFRESH_REUSE, by=None
                )
        return valid

    # --- clients --------------------------------------------------------------------------------------------------
    def _load_application(self, client_id: str, request: Request) -> Application | None:
        application = super()._load_application(client_id, request)
        if application is not None and application.registration_source == Application.RegistrationSource.CIMD:
            self._note_cimd_client(application, request)
        return application

    def _note_cimd_client(self, application: Application, request: Request) -> None:
        agent = str(request.headers.get("HTTP_USER_AGENT", ""))[:300]
        _, created = ClientRegistration.objects.get_or_create(
            application=application,
            defaults={
                "source": ClientRegistration.SOURCE_CIMD,
                "client_address": client_address(request),
                "user_agent": agent,
            },
        )
        if created:
            event(
                "oauth.client_registered",
                Actor(client_address=client_address(request), user_agent=agent),
                client_id=application.client_id,
                client=application_label(application.name, application.client_id),
                source=ClientRegistration.SOURCE_CIMD,
                redirect_uris=application.redirect_uris.split(),
            )
