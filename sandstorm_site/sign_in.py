"""The admin's sign-in page when an OAuth client sent the browser there: which application asks, read from the
authorization request in `next` (nothing in it is trusted: it only chooses what the page says)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.contrib.auth import REDIRECT_FIELD_NAME
from django.http import HttpRequest
from django.urls import reverse
from oauth2_provider.cimd import is_cimd_client_id
from oauth2_provider.models import Application

from oauth.redirects import redirect_host


def authorization_query(next_url: str) -> dict[str, str] | None:
    """The parameters of `next` if it is this server's authorization endpoint (a path, no other host), else None."""
    parts = urlsplit(next_url)
    if parts.scheme or parts.netloc or parts.path != reverse("oauth2_provider:authorize"):
        return None
    return {key: values[0] for key, values in parse_qs(parts.query).items()}


def sign_in_context(request: HttpRequest) -> dict[str, Any]:
    """`oauth_sign_in` and what the card says about the application; nothing for any other sign-in."""
    next_url = request.POST.get(REDIRECT_FIELD_NAME) or request.GET.get(REDIRECT_FIELD_NAME) or ""
    query = authorization_query(next_url)
    if query is None:
        return {}
    client_id = query.get("client_id", "")[:255]
    application = Application.objects.filter(client_id=client_id).first() if client_id else None
    redirect_uri = query.get("redirect_uri", "")
    if not redirect_uri and application is not None:
        redirect_uri = application.default_redirect_uri
    metadata_host = (urlsplit(client_id).hostname or "") if is_cimd_client_id(client_id) else ""
    return {
        "oauth_sign_in": True,
        "client_registered": application is not None,
        "client_name": (application.name if application else "") or "",
        "client_id": client_id,
        # A client that names itself by the URL of its metadata document: fetched once you are signed in.
        "client_metadata_host": metadata_host,
        "redirect_host": redirect_host(redirect_uri) if redirect_uri else "",
    }
