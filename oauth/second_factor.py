"""Who needs a second factor at sign-in, and whether this session has given it: the one policy the admin site, the
consent page, rotation and revocation apply.

- A staff user who has set up a second factor (a confirmed TOTP device or recovery codes) needs it: until the
  session is verified (django-otp's OTPMiddleware, `request.user.is_verified()`), no admin page, no consent.
- With SANDSTORM_REQUIRE_SECOND_FACTOR every staff user needs one, and one who has none must set it up first.
- Everyone else (non-staff users, staff without a device while the setting is off) needs none; such staff are
  offered the set-up once after each password sign-in.

`second_factor_required` guards a view with that policy: an unverified session is sent to the step it still has
to take (the code, or the set-up), with `next` pointing back. It leaves anonymous requests to the view's own sign-in
check, so it goes on top of views that already require a signed-in user (the consent page, admin views).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django_otp import user_has_device

F = TypeVar("F", bound=Callable[..., HttpResponse])

VERIFY_URL_NAME = "admin:second_factor_verify"
OFFER_URL_NAME = "admin:second_factor_offer"


def required_for_everyone() -> bool:
    return bool(getattr(settings, "REQUIRE_SECOND_FACTOR", False))


def is_staff(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def is_enrolled(user: Any) -> bool:
    """The user has a confirmed second-factor device (TOTP or recovery codes)."""
    return bool(user is not None and user.is_authenticated and user_has_device(user, confirmed=True))


def needs_second_factor(user: Any) -> bool:
    """True if this user may use the console only with a verified second factor."""
    return is_staff(user) and (required_for_everyone() or is_enrolled(user))


def is_verified(request: HttpRequest) -> bool:
    """This session's sign-in was completed with a second factor (a device of this user, still confirmed)."""
    check = getattr(request.user, "is_verified", None)  # installed by OTPMiddleware
    return bool(callable(check) and check())


def is_satisfied(request: HttpRequest) -> bool:
    """The policy holds for this request: no second factor needed, or it was given."""
    return not needs_second_factor(request.user) or is_verified(request)


def safe_next(request: HttpRequest, candidate: str | None, default: str | None = None) -> str:
    """`candidate` if it is a path or URL of this site (as Django's login view checks `next`), else `default` (the
    admin's home page)."""
    if candidate and url_has_allowed_host_and_scheme(
        candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return candidate
    return default if default is not None else reverse("admin:index")


def step_url(url_name: str, next_url: str) -> str:
    return f"{reverse(url_name)}?{urlencode({'next': next_url})}"


def pending_step(request: HttpRequest, next_url: str) -> str | None:
    """Where an unverified session must go before `next_url` (the code, or the set-up), or None if nowhere."""
    user = request.user
    if is_satisfied(request):
        return None
    # needs_second_factor: a staff user who is enrolled, or must enroll.
    return step_url(VERIFY_URL_NAME if is_enrolled(user) else OFFER_URL_NAME, next_url)


def after_password_step(request: HttpRequest, next_url: str) -> str | None:
    """Where a staff user goes right after a successful password sign-in: the code, the set-up (required, or
    offered to staff without a device), or None for users who are never asked."""
    if not is_staff(request.user):
        return None
    if is_enrolled(request.user):
        return step_url(VERIFY_URL_NAME, next_url)
    return step_url(OFFER_URL_NAME, next_url)


def second_factor_required(view: F) -> F:
    """Guard `view` with the policy: an authenticated session that still owes its second factor is redirected to
    that step (GET and POST alike: a POST is never acted on)."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        step = pending_step(request, safe_next(request, request.get_full_path()))
        if step is not None:
            return HttpResponseRedirect(step)
        return view(request, *args, **kwargs)

    return guarded  # type: ignore[return-value]  # same signature as `view`
