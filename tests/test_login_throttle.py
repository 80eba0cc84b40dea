"""The admin login throttle (oauth/throttle.py), driven in-process with the test client from chosen addresses:
usernames counted as authentication reads them, waits per username and address that grow, a per-username ceiling
that slows but never stops the user at an address they signed in from before."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from oauth.models import KnownLoginAddress, LoginFailure
from oauth.throttle import (
    FREE_FAILURES_PER_PAIR,
    FREE_FAILURES_PER_USERNAME,
    MAX_FAILURES_PER_ADDRESS,
    PAIR_FIRST_WAIT,
    PAIR_MAX_WAIT,
    USERNAME_MAX_WAIT,
    address_key,
    login_wait,
    username_key,
)

pytestmark = pytest.mark.django_db

PASSWORD = "the right password, 42"
ADMIN_ADDRESS = "198.51.100.7"
ATTACKER = "203.0.113.66"


@pytest.fixture(autouse=True)
def _admin(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # hundreds of guesses, quickly
    get_user_model().objects.create_superuser("admin", password=PASSWORD)
    cache.clear()  # the once-per-window audit marker


def sign_in(username: str, password: str, address: str) -> tuple[bool, str]:
    """(signed in, the page's text) for one attempt at /admin/login/ from `address`, in a fresh browser."""
    response = Client(REMOTE_ADDR=address).post(
        "/admin/login/", {"username": username, "password": password, "next": "/admin/"}
    )
    return response.status_code == 302, response.content.decode()


def fail(username: str, address: str, times: int = 1) -> None:
    for attempt in range(times):
        signed_in, _ = sign_in(username, f"wrong-{attempt}", address)
        assert not signed_in


def throttled_for(page: str) -> int | None:
    """The wait the page asks for, in seconds, or None if it does not say to wait."""
    match = re.search(r"Try again in (\d+) (second|minute)", page)
    if match is None:
        return None
    return int(match[1]) * (60 if match[2] == "minute" else 1)


def backdate_failures(by: timedelta) -> None:
    for failure in LoginFailure.objects.all():
        LoginFailure.objects.filter(pk=failure.pk).update(failed_at=failure.failed_at - by)


@pytest.mark.parametrize("spelling", [" admin", "admin ", "\tadmin", "admin\n", "ａｄｍｉｎ", "\u3000admin"])
def test_a_respelled_username_is_throttled_as_the_name_it_authenticates_as(spelling: str) -> None:
    fail("admin", ATTACKER, FREE_FAILURES_PER_PAIR)
    signed_in, page = sign_in(spelling, PASSWORD, ATTACKER)
    assert not signed_in and throttled_for(page), f"{spelling!r} was not counted as admin"


def test_failures_under_respelled_usernames_count_for_the_name_they_authenticate_as() -> None:
    for spelling in [" admin", "admin ", "\tadmin", "ａｄｍｉｎ", "ADMIN"]:
        fail(spelling, ATTACKER)
    assert set(LoginFailure.objects.values_list("username", flat=True)) == {"admin"}
    assert username_key("ＡＤＭＩＮ ") == "admin"
    signed_in, page = sign_in("admin", PASSWORD, ATTACKER)
    assert not signed_in and throttled_for(page)


def test_the_wait_per_username_and_address_grows_and_is_bounded() -> None:
    fail("admin", ATTACKER, FREE_FAILURES_PER_PAIR)
    waits = []
    for _ in range(8):  # 15 s doubling to the cap in 45 minutes: still within the hour failures are counted
        wait = login_wait("admin", ATTACKER)
        waits.append(wait)
        backdate_failures(timedelta(seconds=wait))  # the wait is over: the next guess is checked, and fails
        fail("admin", ATTACKER)
    assert waits[0] == PAIR_FIRST_WAIT.total_seconds()
    assert waits == sorted(waits) and waits[1] == 2 * waits[0]
    assert max(waits) == PAIR_MAX_WAIT.total_seconds()


def test_a_throttled_attempt_checks_no_password_and_is_refused_at_once() -> None:
    fail("admin", ATTACKER, FREE_FAILURES_PER_PAIR)
    before = LoginFailure.objects.count()
    signed_in, page = sign_in("admin", PASSWORD, ATTACKER)
    assert not signed_in and throttled_for(page) == PAIR_FIRST_WAIT.total_seconds()
    assert LoginFailure.objects.count() == before


def test_failures_from_many_addresses_never_stop_the_admin_at_a_known_address() -> None:
    assert sign_in("admin", PASSWORD, ADMIN_ADDRESS)[0]  # the admin's address becomes known
    for bot in range(40):  # a guessing botnet: every address a few tries, all at "admin"
        fail("admin", f"192.0.2.{bot}", 2)
    signed_in, page = sign_in("admin", PASSWORD, ADMIN_ADDRESS)
    assert signed_in, page


def test_from_an_unknown_address_the_ceiling_slows_but_never_locks() -> None:
    for bot in range(30):
        fail("admin", f"192.0.2.{bot}", 2)
    signed_in, page = sign_in("admin", PASSWORD, "198.51.100.200")
    wait = throttled_for(page)
    assert not signed_in and wait is not None and 0 < wait <= USERNAME_MAX_WAIT.total_seconds()
    backdate_failures(timedelta(seconds=wait))
    assert sign_in("admin", PASSWORD, "198.51.100.200")[0]


def test_the_ceiling_starts_only_after_its_free_failures() -> None:
    for bot in range(FREE_FAILURES_PER_USERNAME - 1):
        fail("admin", f"192.0.2.{bot}")
    assert login_wait("admin", "198.51.100.200") == 0
    fail("admin", "192.0.2.250")
    assert login_wait("admin", "198.51.100.200") > 0


def test_an_address_failing_for_many_usernames_is_refused_for_all() -> None:
    for number in range(MAX_FAILURES_PER_ADDRESS):
        fail(f"nobody-{number}", ATTACKER)
    signed_in, page = sign_in("admin", PASSWORD, ATTACKER)
    assert not signed_in and throttled_for(page)
    assert sign_in("admin", PASSWORD, ADMIN_ADDRESS)[0], "other addresses are not refused"


def test_a_known_address_is_stored_only_as_a_keyed_hash() -> None:
    assert sign_in("admin", PASSWORD, ADMIN_ADDRESS)[0]
    (known,) = KnownLoginAddress.objects.all()
    assert ADMIN_ADDRESS not in known.digest and len(known.digest) == 64
    assert known.user.get_username() == "admin"


def test_a_signed_in_admin_forgives_only_their_own_address() -> None:
    fail("admin", ATTACKER, 3)
    fail("admin", ADMIN_ADDRESS, 2)
    assert sign_in("admin", PASSWORD, ADMIN_ADDRESS)[0]
    assert list(LoginFailure.objects.values_list("client_address", flat=True).distinct()) == [ATTACKER]


def test_ipv6_addresses_are_counted_by_their_64_prefix() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    assert address_key("::ffff:203.0.113.66") == ATTACKER
    for host in range(FREE_FAILURES_PER_PAIR):
        fail("admin", f"2001:db8:1:2::{host + 1:x}")
    signed_in, page = sign_in("admin", PASSWORD, "2001:db8:1:2::ffff")
    assert not signed_in and throttled_for(page)


def test_the_consent_page_signs_in_through_the_same_throttle() -> None:
    fail("admin", ATTACKER, FREE_FAILURES_PER_PAIR)
    browser = Client(REMOTE_ADDR=ATTACKER)
    consent = browser.get("/oauth/authorize/?response_type=code&client_id=x")
    assert consent.status_code == 302
    login_url = consent["Location"]
    assert login_url.startswith("/admin/login/")
    page = browser.post(login_url, {"username": "admin", "password": PASSWORD}).content.decode()
    assert throttled_for(page)


def test_old_failures_are_forgotten() -> None:
    fail("admin", ATTACKER, FREE_FAILURES_PER_PAIR + 3)
    backdate_failures(timedelta(hours=2))
    fail("admin", "192.0.2.1")  # each failure clears what is older than every window
    assert not LoginFailure.objects.filter(client_address=ATTACKER).exists()
    assert timezone.now() - LoginFailure.objects.get().failed_at < timedelta(minutes=1)
