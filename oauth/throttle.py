"""Throttling of admin logins: the admin's login page is also the consent page's, so guessing a staff password is
guessing the keys to a shell. Failures are counted in the database (they survive restarts and are shared by
processes); failed logins themselves are recorded in the audit log by audit/signals.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

from audit.recorder import Actor, event
from oauth.models import LoginFailure

WINDOW = timedelta(minutes=15)
MAX_FAILURES_PER_USERNAME = 5
MAX_FAILURES_PER_ADDRESS = 20


def client_address(request: HttpRequest | None) -> str:
    return str(request.META.get("REMOTE_ADDR", "") or "")[:64] if request is not None else ""


def is_throttled(address: str, username: str) -> bool:
    since = timezone.now() - WINDOW
    recent = LoginFailure.objects.filter(failed_at__gte=since)
    if username and recent.filter(username=username).count() >= MAX_FAILURES_PER_USERNAME:
        return True
    return bool(address) and recent.filter(client_address=address).count() >= MAX_FAILURES_PER_ADDRESS


class ThrottledLoginForm(AdminAuthenticationForm):
    """The admin login form, refusing to check any password once an address or a username has failed too often."""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "throttled": "Too many failed sign-in attempts for this user or from this address. Try again in 15 minutes.",
    }

    def clean(self) -> dict[str, Any]:
        username = str(self.data.get("username", ""))[:150]
        address = client_address(self.request)
        if is_throttled(address, username):
            # Recorded once per window and address/username, so a flood of attempts cannot fill the audit log.
            if cache.add(f"sandstorm:login-throttled:{address}:{username}", True, int(WINDOW.total_seconds())):
                event("admin.login_throttled", Actor(username=username, client_address=address))
            raise ValidationError(self.error_messages["throttled"], code="throttled")
        return super().clean()


@receiver(user_login_failed, dispatch_uid="oauth-count-login-failure")
def count_failure(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    LoginFailure.objects.filter(failed_at__lt=timezone.now() - WINDOW).delete()
    LoginFailure.objects.create(client_address=client_address(request), username=str(credentials.get("username", ""))[:150])


@receiver(user_logged_in, dispatch_uid="oauth-clear-login-failures")
def clear_failures(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    LoginFailure.objects.filter(username=user.get_username()).delete()
