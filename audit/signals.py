"""Admin logins and failed logins, recorded from Django's auth signals."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest

from audit.log import Actor, event


def _client(request: HttpRequest | None) -> tuple[str, str]:
    if request is None:
        return "", ""
    return request.META.get("REMOTE_ADDR", "") or "", request.META.get("HTTP_USER_AGENT", "")[:300]


@receiver(user_logged_in, dispatch_uid="audit-login")
def record_login(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    address, agent = _client(request)
    actor = Actor(
        user_id=user.pk,
        username=user.get_username(),
        credential_kind="session",
        client_address=address,
        user_agent=agent,
    )
    event("admin.login", actor)


@receiver(user_login_failed, dispatch_uid="audit-login-failed")
def record_login_failure(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    address, agent = _client(request)
    # Only the name tried: Django already masks the password in `credentials`, and we never store it anyway.
    attempted = str(credentials.get("username", ""))[:150]
    event("admin.login_failed", Actor(username=attempted, client_address=address, user_agent=agent))
