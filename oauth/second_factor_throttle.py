"""Throttling of second-factor codes, as password failures are throttled (oauth/throttle.py), on top of django-otp's
own per-device back-off (OTP_TOTP_THROTTLE_FACTOR, OTP_STATIC_THROTTLE_FACTOR: 1 s, 2 s, 4 s, ...).

Wrong codes are counted in the same table as wrong passwords, under the username with a prefix no real username
can have (`second-factor:`, a colon), so:
- per user and address: 5 wrong codes free, then a wait that doubles from 15 s up to 15 minutes;
- per address: wrong codes and wrong passwords together, at most 20 within 15 minutes.
A correct password does not forgive wrong codes (it forgives only the password's own count): whoever knows the
password cannot sign in again to start counting afresh. A correct code forgives this user's wrong codes from this
address.
"""

from __future__ import annotations

import math

from django.db.models import Max
from django.utils import timezone

from oauth.models import LoginFailure
from oauth.throttle import (
    ADDRESS_WINDOW,
    FREE_FAILURES_PER_PAIR,
    MAX_FAILURES_PER_ADDRESS,
    PAIR_FIRST_WAIT,
    PAIR_MAX_WAIT,
    PAIR_WINDOW,
    USERNAME_LENGTH,
    growing_wait,
    username_key,
)

PREFIX = "second-factor:"


def counted_name(username: str) -> str:
    return (PREFIX + username_key(username))[:USERNAME_LENGTH]


def code_wait(username: str, address: str) -> int:
    """Whole seconds before a code may be checked for `username` from `address` (an address_key); 0: now."""
    now = timezone.now()
    waits = [0.0]
    pair = LoginFailure.objects.filter(
        username=counted_name(username), client_address=address, failed_at__gte=now - PAIR_WINDOW
    )
    count = pair.count()
    if count >= FREE_FAILURES_PER_PAIR:
        last = pair.aggregate(last=Max("failed_at"))["last"]
        waits.append(
            (last + growing_wait(count, FREE_FAILURES_PER_PAIR, PAIR_FIRST_WAIT, PAIR_MAX_WAIT) - now).total_seconds()
        )
    if address:
        recent = LoginFailure.objects.filter(client_address=address, failed_at__gte=now - ADDRESS_WINDOW)
        times = list(recent.order_by("-failed_at").values_list("failed_at", flat=True)[:MAX_FAILURES_PER_ADDRESS])
        if len(times) >= MAX_FAILURES_PER_ADDRESS:
            waits.append((times[-1] + ADDRESS_WINDOW - now).total_seconds())
    return max(0, math.ceil(max(waits)))


def count_wrong_code(username: str, address: str) -> None:
    LoginFailure.objects.filter(failed_at__lt=timezone.now() - PAIR_WINDOW).delete()
    LoginFailure.objects.create(username=counted_name(username), client_address=address)


def forgive(username: str, address: str) -> None:
    LoginFailure.objects.filter(username=counted_name(username), client_address=address).delete()
