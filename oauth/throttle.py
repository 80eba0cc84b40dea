"""Throttling of admin logins: the admin's login page is also the consent page's, so guessing a staff password is
guessing the keys to a shell. Failures are counted in the database (they survive restarts and are shared by
processes); failed logins themselves are recorded in the audit log by audit/signals.py.

Three counts, none of which ever locks a user out of an address they have signed in from before:
- per username and address: 5 failures free, then a wait that doubles from 15 s up to 15 minutes;
- per address: 20 failures within 15 minutes (any usernames), then none until the oldest is 15 minutes old;
- per username from everywhere (guessing from many addresses): 10 failures within 15 minutes free, then a wait
  that doubles from 5 s up to 60 s, for every address except the user's known ones (where they signed in with the
  right password before), so an attacker slows the real admin elsewhere but cannot stop them.
A throttled attempt is answered "try again in N" at once (nothing sleeps) and checks no password.

The username is counted as the login form authenticates it (its UsernameField strips and NFKC-normalises, as does
the user model's `normalize_username`), then case-folded, so no spelling of a name escapes its count. The address
is the client's as Daphne gives it (REMOTE_ADDR; behind Caddy, from the X-Forwarded-For Caddy sets), an IPv6
address counted by its /64, which one client usually holds whole.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UsernameField
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db.models import Max, QuerySet
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone
from django.utils.crypto import salted_hmac

from audit.log import Actor, event
from oauth.models import KnownLoginAddress, LoginFailure

FREE_FAILURES_PER_PAIR = 5
PAIR_FIRST_WAIT = timedelta(seconds=15)
PAIR_MAX_WAIT = timedelta(minutes=15)
PAIR_WINDOW = timedelta(hours=1)
MAX_FAILURES_PER_ADDRESS = 20
ADDRESS_WINDOW = timedelta(minutes=15)
FREE_FAILURES_PER_USERNAME = 10
USERNAME_FIRST_WAIT = timedelta(seconds=5)
USERNAME_MAX_WAIT = timedelta(seconds=60)
USERNAME_WINDOW = timedelta(minutes=15)
KNOWN_ADDRESS_LIFETIME = timedelta(days=180)
KNOWN_ADDRESSES_PER_USER = 20
USERNAME_LENGTH = 150


def client_address(request: HttpRequest | None) -> str:
    return str(request.META.get("REMOTE_ADDR", "") or "")[:64] if request is not None else ""


def address_key(address: str) -> str:
    """What an address is counted as: itself, or for IPv6 its /64 (an IPv4-mapped one as the IPv4 address)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip.exploded.split("%")[0], 64), strict=False))
    return str(ip)


def username_key(username: str) -> str:
    """The name a login attempt is counted under: cleaned as the login form and the user model clean it (so that
    " admin", "admin\\t" and a fullwidth "ａｄｍｉｎ" are "admin"), then case-folded."""
    cleaned = UsernameField(max_length=USERNAME_LENGTH).to_python(username) or ""
    return str(get_user_model().normalize_username(cleaned)).casefold()[:USERNAME_LENGTH]


def known_address_digest(username: str, address: str) -> str:
    # A keyed hash (Django's SECRET_KEY): the table does not list the addresses admins sign in from.
    return salted_hmac("sandstorm.oauth.known-login-address", f"{username}\n{address}", algorithm="sha256").hexdigest()


def is_known_address(username: str, address: str) -> bool:
    since = timezone.now() - KNOWN_ADDRESS_LIFETIME
    return KnownLoginAddress.objects.filter(
        digest=known_address_digest(username, address), last_login_at__gte=since
    ).exists()


def growing_wait(failures: int, free: int, first: timedelta, cap: timedelta) -> timedelta:
    """No wait for the first `free` failures, then `first`, doubling with each further failure, at most `cap`."""
    if failures < free:
        return timedelta(0)
    return min(first * 2 ** min(failures - free, 20), cap)


def _wait_after_last(
    failures: QuerySet[LoginFailure], free: int, first: timedelta, cap: timedelta, now: datetime
) -> float:
    count = failures.count()
    if count < free:
        return 0.0
    last = failures.aggregate(last=Max("failed_at"))["last"]
    return (last + growing_wait(count, free, first, cap) - now).total_seconds()


def _address_wait(address: str, now: datetime) -> float:
    recent = LoginFailure.objects.filter(client_address=address, failed_at__gte=now - ADDRESS_WINDOW)
    times = list(recent.order_by("-failed_at").values_list("failed_at", flat=True)[:MAX_FAILURES_PER_ADDRESS])
    if len(times) < MAX_FAILURES_PER_ADDRESS:
        return 0.0
    return (times[-1] + ADDRESS_WINDOW - now).total_seconds()


def login_wait(username: str, address: str) -> int:
    """Whole seconds before a password may be checked for `username` from `address` (both keys; 0: now)."""
    now = timezone.now()
    waits = [_address_wait(address, now)] if address else []
    if username:
        pair = LoginFailure.objects.filter(username=username, client_address=address, failed_at__gte=now - PAIR_WINDOW)
        waits.append(_wait_after_last(pair, FREE_FAILURES_PER_PAIR, PAIR_FIRST_WAIT, PAIR_MAX_WAIT, now))
        everywhere = LoginFailure.objects.filter(username=username, failed_at__gte=now - USERNAME_WINDOW)
        ceiling = _wait_after_last(everywhere, FREE_FAILURES_PER_USERNAME, USERNAME_FIRST_WAIT, USERNAME_MAX_WAIT, now)
        if ceiling > 0 and not is_known_address(username, address):
            waits.append(ceiling)
    return max(0, math.ceil(max(waits, default=0.0)))


def in_words(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    return f"{math.ceil(seconds / 60)} minutes"


class ThrottledLoginForm(AdminAuthenticationForm):
    """The admin login form (the consent page's too), refusing to check a password while a throttle says wait."""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "throttled": "Too many failed sign-in attempts for this user or from this address. Try again in %(wait)s.",
    }

    def clean(self) -> dict[str, Any]:
        # The username as the form's own field cleaned it: exactly the name authenticate() is about to be given.
        username = username_key(str(self.cleaned_data.get("username") or ""))
        address = address_key(client_address(self.request))
        wait = login_wait(username, address)
        if wait:
            # Recorded once per window and address/username, so a flood of attempts cannot fill the audit log.
            marker = hashlib.sha256(f"{address}\n{username}".encode()).hexdigest()
            if cache.add(f"sandstorm:login-throttled:{marker}", True, int(ADDRESS_WINDOW.total_seconds())):
                event("admin.login_throttled", Actor(username=username, client_address=client_address(self.request)))
            raise ValidationError(self.error_messages["throttled"], code="throttled", params={"wait": in_words(wait)})
        return super().clean()


@receiver(user_login_failed, dispatch_uid="oauth-count-login-failure")
def count_failure(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    LoginFailure.objects.filter(failed_at__lt=timezone.now() - PAIR_WINDOW).delete()
    LoginFailure.objects.create(
        client_address=address_key(client_address(request)), username=username_key(str(credentials.get("username", "")))
    )


@receiver(user_logged_in, dispatch_uid="oauth-clear-login-failures")
def remember_address(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """The address becomes known for this user; its own failures are forgiven. Failures elsewhere are kept: an
    attacker's count must not restart because the real admin signed in."""
    username, address = username_key(user.get_username()), address_key(client_address(request))
    LoginFailure.objects.filter(username=username, client_address=address).delete()
    KnownLoginAddress.objects.update_or_create(
        digest=known_address_digest(username, address), defaults={"user": user, "last_login_at": timezone.now()}
    )
    keep = (
        KnownLoginAddress.objects.filter(user=user)
        .order_by("-last_login_at")
        .values_list("pk", flat=True)[:KNOWN_ADDRESSES_PER_USER]
    )
    KnownLoginAddress.objects.filter(user=user).exclude(pk__in=list(keep)).delete()
