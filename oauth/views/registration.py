"""Dynamic client registration (RFC 7591/7592): the toolkit's views with the policy it lacks.

Registration is open (Claude.ai registers anonymously) but limited: so many registrations per client address per
hour; only the grant types `authorization_code` and `refresh_token` and the response type `code` (the toolkit
accepts any grant type, so an anonymous `client_credentials` client would get tokens with no user); token endpoint
auth `none`, `client_secret_post` or `client_secret_basic`; redirect URIs over https, or http to loopback.
The metadata is bounded: a body of at most CIMD_MAX_DOCUMENT_SIZE bytes (the cap a client ID metadata document
has, 16 KiB: 413 above it), so many redirect URIs of so many characters, a client name the Application can hold.
Fields we do not use are dropped: the toolkit stores only the ones it knows, and nothing else is audited or echoed.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from oauth2_provider.models import Application
from oauth2_provider.settings import oauth2_settings
from oauth2_provider.views import DynamicClientRegistrationManagementView, DynamicClientRegistrationView

from audit.log import Actor, event
from oauth.credentials import application_label
from oauth.models import AppSuspension, ClientRegistration
from oauth.redirects import redirect_uri_refusal

GRANT_TYPES = frozenset({"authorization_code", "refresh_token"})
RESPONSE_TYPES = frozenset({"code"})
AUTH_METHODS = ("none", "client_secret_post", "client_secret_basic")
RATE_WINDOW = timedelta(hours=1)
MAX_REDIRECT_URIS = 10
MAX_REDIRECT_URI_LENGTH = 1024
MAX_CLIENT_NAME_LENGTH = 255  # the toolkit's Application.name


SUSPENDED_DELETE = (
    "This client is suspended by an administrator of this Sandstorm server: its registration stays until an "
    "administrator resumes or removes it."
)


def error(code: str, description: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": code, "error_description": description}, status=status)


def _string_list(data: dict[str, Any], name: str, default: list[str]) -> list[str] | None:
    value = data.get(name, default)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return value


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(key) or _holds_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


def metadata_refusal(data: dict[str, Any]) -> JsonResponse | None:
    """Our registration policy on RFC 7591 client metadata: the error response, or None if acceptable."""
    if _holds_nul(data):
        # PostgreSQL can store no NUL (a 500 there), SQLite would: refused on both (see sandstorm_site/nul.py).
        return error("invalid_client_metadata", "client metadata must not contain NUL characters")
    grant_types = _string_list(data, "grant_types", ["authorization_code"])
    if grant_types is None or not set(grant_types) <= GRANT_TYPES or "authorization_code" not in grant_types:
        return error("invalid_client_metadata", "grant_types must be authorization_code, optionally with refresh_token")
    response_types = _string_list(data, "response_types", ["code"])
    if response_types is None or not set(response_types) <= RESPONSE_TYPES:
        return error("invalid_client_metadata", "response_types must be code")
    if data.get("token_endpoint_auth_method", "client_secret_basic") not in AUTH_METHODS:
        return error("invalid_client_metadata", f"token_endpoint_auth_method must be one of {', '.join(AUTH_METHODS)}")
    name = data.get("client_name", "")
    if not isinstance(name, str) or len(name) > MAX_CLIENT_NAME_LENGTH:
        return error(
            "invalid_client_metadata", f"client_name must be a string of at most {MAX_CLIENT_NAME_LENGTH} characters"
        )
    redirect_uris = _string_list(data, "redirect_uris", [])
    if not redirect_uris:
        return error("invalid_redirect_uri", "redirect_uris must be a non-empty array of strings")
    if len(redirect_uris) > MAX_REDIRECT_URIS:
        return error("invalid_redirect_uri", f"a client may register at most {MAX_REDIRECT_URIS} redirect URIs")
    for uri in redirect_uris:
        if len(uri) > MAX_REDIRECT_URI_LENGTH:
            return error(
                "invalid_redirect_uri",
                f"a redirect URI must be at most {MAX_REDIRECT_URI_LENGTH} characters: {uri[:200]}",
            )
        refusal = redirect_uri_refusal(uri)
        if refusal is not None:
            return error("invalid_redirect_uri", f"{refusal}: {uri[:200]}")
    return None


def read_metadata(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    """The request's JSON object, or the error response: 413 above the metadata size cap, 400 for anything else."""
    limit = oauth2_settings.CIMD_MAX_DOCUMENT_SIZE
    too_big = error("invalid_client_metadata", f"client metadata must be at most {limit} bytes", 413)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return too_big
    try:
        body = request.body
    except RequestDataTooBig:
        return too_big
    if len(body) > limit:
        return too_big
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # deep nesting raises RecursionError, not ValueError
        data = None
    return data if isinstance(data, dict) else error("invalid_client_metadata", "Request body must be a JSON object")


def client_address(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR", "") or "")[:64]


def registration_wait(address: str) -> int:
    """Seconds until this address may register again (0: now)."""
    limit = settings.REGISTRATION_RATE_LIMIT
    if limit <= 0:
        return 0
    since = timezone.now() - RATE_WINDOW
    recent = ClientRegistration.objects.filter(
        client_address=address, source=ClientRegistration.SOURCE_DCR, registered_at__gte=since
    ).order_by("-registered_at")
    times = list(recent.values_list("registered_at", flat=True)[:limit])
    if len(times) < limit:
        return 0
    return max(1, int((times[-1] - since).total_seconds()) + 1)


class RegistrationView(DynamicClientRegistrationView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        address = client_address(request)
        wait = registration_wait(address)
        if wait:
            response = error("rate_limited", "Too many client registrations from this address; try again later.", 429)
            response["Retry-After"] = str(wait)
            return response
        data = read_metadata(request)
        if isinstance(data, JsonResponse):
            return data
        refusal = metadata_refusal(data)
        if refusal is not None:
            return refusal
        response = super().post(request, *args, **kwargs)
        if response.status_code != 201:
            return response
        return self.registered(request, data, json.loads(response.content), address)

    def registered(
        self, request: HttpRequest, data: dict[str, Any], body: dict[str, Any], address: str
    ) -> JsonResponse:
        application = Application.objects.get(client_id=body["client_id"])
        agent = request.META.get("HTTP_USER_AGENT", "")[:300]
        ClientRegistration.objects.create(
            application=application, source=ClientRegistration.SOURCE_DCR, client_address=address, user_agent=agent
        )
        method = data.get("token_endpoint_auth_method", "client_secret_basic")
        event(
            "oauth.client_registered",
            Actor(client_address=address, user_agent=agent),
            client_id=application.client_id,
            client=application_label(application.name, application.client_id),
            source=ClientRegistration.SOURCE_DCR,
            redirect_uris=application.redirect_uris.split(),
            token_endpoint_auth_method=method,
        )
        # The toolkit answers client_secret_basic for every confidential client; its token endpoint takes both
        # methods, so confirm the one the client asked for.
        body["token_endpoint_auth_method"] = method
        response = JsonResponse(body, status=201)
        response["Cache-Control"] = "no-store"
        return response


class RegistrationManagementView(DynamicClientRegistrationManagementView):
    def put(self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        data = read_metadata(request)
        if isinstance(data, JsonResponse):
            return data
        # Authenticate first (so an anonymous caller learns nothing), then apply the registration policy.
        auth = self._authenticate_registration_request(request, client_id)
        if isinstance(auth, HttpResponse):
            return auth
        refusal = metadata_refusal(data)
        if refusal is not None:
            return refusal
        return super().put(request, client_id, *args, **kwargs)

    def delete(self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        """A suspended client may not delete its registration: that would delete its suspension with it, and it
        could register again as a client the console knows nothing against."""
        auth = self._authenticate_registration_request(request, client_id)
        if isinstance(auth, HttpResponse):
            return auth
        if AppSuspension.objects.filter(application__client_id=client_id).exists():
            return error("access_denied", SUSPENDED_DELETE, status=403)
        return super().delete(request, client_id, *args, **kwargs)
