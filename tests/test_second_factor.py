"""The staff second factor (oauth/second_factor.py, its pages and `reset_second_factor`), in-process with the test
client: who needs it, the offer after the password, set-up with recovery codes shown once, the code at sign-in,
wrong codes throttled and recorded, the admin and the consent page closed until then."""

from __future__ import annotations

import base64
import re
import time
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, User
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.models import AuditRecord
from oauth import second_factor
from oauth.models import LoginFailure
from oauth.second_factor_throttle import counted_name

pytestmark = pytest.mark.django_db

PASSWORD = "the right password, 42"


@pytest.fixture(autouse=True)
def _clean(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.REQUIRE_SECOND_FACTOR = False
    cache.clear()


@pytest.fixture
def staff() -> User:
    return get_user_model().objects.create_superuser("boss", password=PASSWORD)


def enroll(user: User, codes: tuple[str, ...] = ("aaaabbbb", "ccccdddd")) -> TOTPDevice:
    device = TOTPDevice.objects.create(user=user, name="app", confirmed=True)
    recovery = StaticDevice.objects.create(user=user, name="recovery codes", confirmed=True)
    for code in codes:
        StaticToken.objects.create(device=recovery, token=code)
    return device


def code_for(device: TOTPDevice, steps_ahead: int = 0) -> str:
    device.refresh_from_db()
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() + steps_ahead * device.step
    return str(totp.token()).zfill(device.digits)


def not_a_code(device: TOTPDevice) -> str:
    """Six digits the device accepts at no step within its tolerance."""
    valid = {code_for(device, ahead) for ahead in range(-2, 3)}
    return next(str(n).zfill(6) for n in range(1000000) if str(n).zfill(6) not in valid)


def sign_in(client: Client, username: str = "boss", next_url: str = "/admin/") -> Any:
    response = client.post("/admin/login/", {"username": username, "password": PASSWORD, "next": next_url})
    assert response.status_code == 302, response.content.decode()[:500]
    return response


def events(name: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(event=name).order_by("id"))


def request_for(user: Any) -> HttpRequest:
    request = RequestFactory().get("/somewhere/")
    request.user = user
    return request


# --- the policy -----------------------------------------------------------------------------------------------------


def test_who_needs_a_second_factor(settings: Any, staff: User) -> None:
    plain = get_user_model().objects.create_user("plain", password=PASSWORD)
    assert not second_factor.needs_second_factor(AnonymousUser())
    assert not second_factor.needs_second_factor(plain)
    assert not second_factor.needs_second_factor(staff), "staff without a device, setting off: offered only"
    enroll(staff)
    assert second_factor.needs_second_factor(staff)
    staff.is_active = False
    assert not second_factor.needs_second_factor(staff)

    settings.REQUIRE_SECOND_FACTOR = True
    other = get_user_model().objects.create_user("helper", password=PASSWORD, is_staff=True)
    assert second_factor.needs_second_factor(other), "required for everyone: unenrolled staff too"
    assert not second_factor.needs_second_factor(plain), "never for non-staff users"


def test_an_unconfirmed_device_is_not_an_enrollment(staff: User) -> None:
    TOTPDevice.objects.create(user=staff, name="half-done", confirmed=False)
    assert not second_factor.is_enrolled(staff)
    assert not second_factor.needs_second_factor(staff)


def test_is_verified_needs_the_middleware_mark(staff: User) -> None:
    request = request_for(staff)
    assert not second_factor.is_verified(request), "no OTPMiddleware: not verified"
    staff.is_verified = lambda: True  # type: ignore[attr-defined]  # as OTPMiddleware installs it
    assert second_factor.is_verified(request)


def test_the_decorator_sends_an_unverified_session_to_its_step(settings: Any, staff: User) -> None:
    @second_factor.second_factor_required
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("inside")

    staff.is_verified = lambda: False  # type: ignore[attr-defined]
    assert view(request_for(staff)).status_code == 200, "not enrolled, not required: let through"
    assert view(request_for(AnonymousUser())).status_code == 200, "anonymous: the view's own sign-in check decides"

    enroll(staff)
    answer = view(request_for(staff))
    assert answer.status_code == 302 and answer["Location"] == "/admin/second-factor/?next=%2Fsomewhere%2F"
    staff.is_verified = lambda: True  # type: ignore[attr-defined]
    assert view(request_for(staff)).status_code == 200

    settings.REQUIRE_SECOND_FACTOR = True
    newcomer = get_user_model().objects.create_user("newcomer", password=PASSWORD, is_staff=True)
    newcomer.is_verified = lambda: False  # type: ignore[attr-defined]
    answer = view(request_for(newcomer))
    assert answer["Location"] == "/admin/second-factor/offer/?next=%2Fsomewhere%2F"


def test_next_must_be_this_site(staff: User) -> None:
    request = request_for(staff)
    assert second_factor.safe_next(request, "/admin/oauth/") == "/admin/oauth/"
    assert second_factor.safe_next(request, "https://evil.example/") == "/admin/"
    assert second_factor.safe_next(request, "//evil.example/x") == "/admin/"


# --- the pages ------------------------------------------------------------------------------------------------------


def test_first_sign_in_offers_the_set_up_once_and_not_now_goes_on(staff: User) -> None:
    client = Client()
    going = sign_in(client, next_url="/admin/oauth/bearertoken/")["Location"]
    assert going == "/admin/second-factor/offer/?next=%2Fadmin%2Foauth%2Fbearertoken%2F"
    page = client.get(going).content.decode()
    assert 'id="second-factor-not-now"' in page and 'href="/admin/oauth/bearertoken/"' in page
    assert client.get("/admin/oauth/bearertoken/").status_code == 200, "not now: the admin is open"
    assert client.get("/admin/").status_code == 200, "and the offer does not come back on each page"


def test_the_offer_keeps_no_foreign_next(staff: User) -> None:
    client = Client()
    sign_in(client)
    page = client.get("/admin/second-factor/offer/?next=https://evil.example/").content.decode()
    assert "evil.example" not in page


def test_set_up_shows_a_qr_code_and_the_key_then_recovery_codes_once(staff: User) -> None:
    client = Client()
    sign_in(client)
    page = client.get("/admin/second-factor/set-up/?next=/admin/").content.decode()
    device = TOTPDevice.objects.get(user=staff, confirmed=False)
    assert re.search(r'id="second-factor-qr"><svg [^>]*class="segno"', page), "the QR code, inline SVG from here"
    secret = re.search(r'id="second-factor-secret">([A-Z2-7 ]+)<', page)
    assert secret is not None
    assert base64.b32decode(secret.group(1).replace(" ", "")) == device.bin_key
    assert client.get("/admin/second-factor/set-up/").status_code == 200
    assert TOTPDevice.objects.filter(user=staff).count() == 1, "a reload shows the same key"

    wrong = client.post("/admin/second-factor/set-up/?next=/admin/", {"code": not_a_code(device), "next": "/admin/"})
    assert wrong.status_code == 200 and "That code is not right" in wrong.content.decode()
    assert not second_factor.is_enrolled(staff)
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_timestamp=timezone.now())  # however slow CI is
    soon = client.post("/admin/second-factor/set-up/?next=/admin/", {"code": code_for(device), "next": "/admin/"})
    assert "Too many wrong codes in a row. Try again in 1 second" in soon.content.decode(), "the device backs off"
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_count=0)  # as after the wait

    done = client.post("/admin/second-factor/set-up/?next=/admin/", {"code": code_for(device), "next": "/admin/"})
    assert done.status_code == 302 and "/admin/second-factor/recovery-codes/" in done["Location"]
    shown = client.get(done["Location"]).content.decode()
    codes = re.findall(r"<li><code>([a-z2-7 ]+)</code></li>", shown)
    assert len(codes) == 10
    assert sorted(c.replace(" ", "") for c in codes) == sorted(
        StaticToken.objects.filter(device__user=staff).values_list("token", flat=True)
    )
    again = client.get(done["Location"]).content.decode()
    assert "already shown" in again and codes[0] not in again
    assert client.get("/admin/").status_code == 200, "the session that enrolled is verified"
    assert [e.username for e in events("admin.second_factor_enrolled")] == ["boss"]
    assert events("admin.second_factor_failed")[0].detail == {"by": "authenticator app", "step": "set-up"}


def test_an_enrolled_user_must_give_the_code_before_any_admin_page(staff: User) -> None:
    device = enroll(staff)
    client = Client()
    going = sign_in(client, next_url="/admin/oauth/bearertoken/")["Location"]
    assert going == "/admin/second-factor/?next=%2Fadmin%2Foauth%2Fbearertoken%2F"
    for closed in ("/admin/", "/admin/oauth/bearertoken/", "/admin/audit/overview/"):
        answer = client.get(closed, follow=True)
        assert answer.redirect_chain[-1][0].startswith("/admin/second-factor/?next="), closed
    assert "logout" not in client.get("/admin/second-factor/").content.decode().lower()

    verified = client.post(going, {"code": code_for(device), "next": "/admin/oauth/bearertoken/"})
    assert verified.status_code == 302 and verified["Location"] == "/admin/oauth/bearertoken/"
    assert client.get("/admin/oauth/bearertoken/").status_code == 200
    assert [e.detail for e in events("admin.second_factor_verified")] == [{"by": "authenticator app"}]


def test_a_wrong_code_is_refused_recorded_and_counted(staff: User) -> None:
    device = enroll(staff)
    client = Client(REMOTE_ADDR="198.51.100.9")
    sign_in(client)
    answer = client.post("/admin/second-factor/", {"code": not_a_code(device), "next": "/admin/"})
    assert answer.status_code == 200 and "That code is not right" in answer.content.decode()
    assert client.get("/admin/").status_code == 302
    assert [e.detail for e in events("admin.second_factor_failed")] == [{"by": "authenticator app"}]
    assert events("admin.second_factor_failed")[0].client_address == "198.51.100.9"
    assert LoginFailure.objects.filter(username=counted_name("boss"), client_address="198.51.100.9").count() == 1
    device.refresh_from_db()
    assert device.throttling_failure_count == 1, "django-otp's own throttle is on"
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_timestamp=timezone.now())  # however slow CI is
    soon = client.post("/admin/second-factor/", {"code": code_for(device), "next": "/admin/"})
    assert "Too many wrong codes in a row. Try again in 1 second" in soon.content.decode(), "1 s after one wrong code"


def test_wrong_codes_wait_like_wrong_passwords_and_a_new_password_sign_in_does_not_forgive_them(staff: User) -> None:
    device = enroll(staff)
    for _ in range(5):
        LoginFailure.objects.create(username=counted_name("boss"), client_address="198.51.100.9")
    client = Client(REMOTE_ADDR="198.51.100.9")
    sign_in(client)  # the right password again
    answer = client.post("/admin/second-factor/", {"code": code_for(device), "next": "/admin/"})
    assert "Too many wrong codes for this user from this address. Try again in 15 seconds" in answer.content.decode()
    assert client.get("/admin/").status_code == 302
    assert len(events("admin.second_factor_throttled")) == 1


def test_a_recovery_code_works_once(staff: User) -> None:
    enroll(staff, codes=("aaaabbbb", "ccccdddd"))
    first = Client()
    sign_in(first)
    used = first.post("/admin/second-factor/", {"code": "AAAA BBBB", "next": "/admin/"})
    assert used.status_code == 302 and first.get("/admin/").status_code == 200
    assert [e.detail for e in events("admin.recovery_code_used")] == [{"recovery_codes_left": 1}]

    second = Client()
    sign_in(second)
    again = second.post("/admin/second-factor/", {"code": "aaaabbbb", "next": "/admin/"})
    assert again.status_code == 200 and "not one of your unused recovery codes" in again.content.decode()
    assert second.get("/admin/").status_code == 302
    assert [e.detail for e in events("admin.second_factor_failed")] == [{"by": "recovery code"}]


def test_with_the_setting_on_an_unenrolled_user_cannot_skip_the_set_up(settings: Any, staff: User) -> None:
    settings.REQUIRE_SECOND_FACTOR = True
    client = Client()
    going = sign_in(client)["Location"]
    assert going.startswith("/admin/second-factor/offer/")
    page = client.get(going).content.decode()
    assert "second-factor-not-now" not in page and "requires a second factor" in page
    assert "second-factor-not-now" not in client.get("/admin/second-factor/set-up/").content.decode()
    answer = client.get("/admin/oauth/bearertoken/", follow=True)
    assert answer.redirect_chain[-1][0].startswith("/admin/second-factor/offer/")


def test_the_consent_page_asks_an_enrolled_user_for_the_code_first(staff: User) -> None:
    enroll(staff)
    client = Client()
    sign_in(client)
    url = "/oauth/authorize/?response_type=code&client_id=x&state=s"
    for answer in (client.get(url), client.post(url, {"allow": "Authorize", "client_id": "x"})):
        assert answer.status_code == 302
        assert answer["Location"].startswith("/admin/second-factor/?next=%2Foauth%2Fauthorize%2F")


def test_the_second_step_needs_the_password_first() -> None:
    answer = Client().get("/admin/second-factor/?next=/admin/")
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/")
    assert Client().get("/admin/second-factor/set-up/").status_code == 302


def test_sign_out_from_the_second_step(staff: User) -> None:
    enroll(staff)
    client = Client()
    sign_in(client)
    assert client.get("/admin/second-factor/sign-out/").status_code == 405
    assert client.post("/admin/second-factor/sign-out/")["Location"] == "/admin/login/"
    assert client.get("/admin/second-factor/")["Location"].startswith("/admin/login/")


# --- reset_second_factor --------------------------------------------------------------------------------------------


def test_reset_second_factor_removes_the_devices_and_records_who(staff: User) -> None:
    enroll(staff)
    TOTPDevice.objects.create(user=staff, name="half-done", confirmed=False)
    out = StringIO()
    call_command("reset_second_factor", "boss", stdout=out)
    printed = out.getvalue()
    assert "Removed authenticator app 'app' (confirmed) of boss." in printed
    assert "Removed authenticator app 'half-done' (not confirmed) of boss." in printed
    assert "Removed recovery codes 'recovery codes' (2 unused, confirmed) of boss." in printed
    assert not TOTPDevice.objects.filter(user=staff).exists() and not StaticDevice.objects.filter(user=staff).exists()
    (record,) = events("admin.second_factor_reset")
    assert record.credential_kind == "shell" and record.username  # the OS user who ran it
    assert record.detail is not None and record.detail["user"] == "boss" and len(record.detail["removed"]) == 3

    again = StringIO()
    call_command("reset_second_factor", "boss", stdout=again)
    assert "nothing removed" in again.getvalue() and len(events("admin.second_factor_reset")) == 1
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("reset_second_factor", "nobody")


def test_the_devices_throttle_is_on(settings: Any) -> None:
    assert settings.OTP_TOTP_THROTTLE_FACTOR >= 1 and settings.OTP_STATIC_THROTTLE_FACTOR >= 1
    assert "django_otp.middleware.OTPMiddleware" in settings.MIDDLEWARE
    middleware = settings.MIDDLEWARE
    assert middleware.index("django_otp.middleware.OTPMiddleware") > middleware.index(
        "django.contrib.auth.middleware.AuthenticationMiddleware"
    )


def test_second_factor_devices_have_no_admin_pages_that_could_remove_one_unrecorded() -> None:
    from django.contrib import admin
    from django_otp.plugins.otp_static.models import StaticDevice
    from django_otp.plugins.otp_totp.models import TOTPDevice

    assert not admin.site.is_registered(TOTPDevice) and not admin.site.is_registered(StaticDevice)
