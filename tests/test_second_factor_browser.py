"""The staff second factor as a person meets it, in headless Chromium on live servers of this module's own (the
session's shared servers keep an unenrolled admin): first sign-in with TOTP set-up and recovery codes shown once,
the code at the next sign-ins (a wrong one refused, a recovery code good once), SANDSTORM_REQUIRE_SECOND_FACTOR
leaving no way round the set-up, the consent page of a real PKCE flow closed until the code is given, and
`reset_second_factor` for a lost phone.

Codes are computed as the authenticator app would, with django-otp's own TOTP from the key in the server's
database; each code is accepted once, so the next one is taken past the last step the server accepted."""

from __future__ import annotations

import getpass
import time
from base64 import b32decode
from binascii import unhexlify
from collections.abc import Iterator
from typing import Any

import pytest
from django_otp.oath import TOTP
from playwright.sync_api import Browser, BrowserContext, Page

from tests.artifacts import artifact_dir
from tests.live import LiveServer, running_server
from tests.oauth_flow import (
    AdminSession,
    audit_events,
    authorize_url,
    exchange,
    hidden_inputs,
    pkce,
    query_of,
    register,
    shell,
)

pytestmark = [pytest.mark.live, pytest.mark.browser]

PASSWORD = "second-factor-password-123"
WIDTH = 1280


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("second-factor")) as live:
        yield live


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    yield context
    context.close()


def make_staff(server: LiveServer, username: str) -> None:
    shell(server, f"from django.contrib.auth import get_user_model; "
                  f"get_user_model().objects.create_superuser({username!r}, password={PASSWORD!r})")  # fmt: skip


def enroll_in_database(server: LiveServer, username: str) -> None:
    """A confirmed authenticator device, as if set up in the browser (for tests about what comes after)."""
    shell(server, "from django.contrib.auth import get_user_model; "
                  "from django_otp.plugins.otp_totp.models import TOTPDevice; "
                  f"TOTPDevice.objects.create(user=get_user_model().objects.get(username={username!r}), name='app')")  # fmt: skip


def device_state(server: LiveServer, username: str) -> dict[str, Any]:
    """The user's newest TOTP device as the server's database holds it (django-otp's TOTPDevice: its key in hex)."""
    state = server.database.one(
        'SELECT d."key", d.step, d.t0, d.digits, d.drift, d.last_t, d.tolerance, d.confirmed'
        " FROM otp_totp_totpdevice d JOIN auth_user u ON u.id = d.user_id WHERE u.username = %s"
        " ORDER BY d.id DESC LIMIT 1",
        username,
    )
    return {**state, "confirmed": bool(state["confirmed"])}  # SQLite's 0 or 1, PostgreSQL's boolean


def totp_of(state: dict[str, Any]) -> TOTP:
    totp = TOTP(unhexlify(state["key"]), state["step"], state["t0"], state["digits"], state["drift"])
    totp.time = time.time()
    return totp


def code_now(server: LiveServer, username: str) -> str:
    """The code the app shows, or the next step's if the server already accepted this step's (each works once)."""
    state = device_state(server, username)
    totp = totp_of(state)
    ahead = max(0, state["last_t"] + 1 - totp.t())
    assert ahead <= state["tolerance"], "no code within the tolerance is left unused"
    totp.time += ahead * state["step"]
    return str(totp.token()).zfill(state["digits"])


def wrong_code(server: LiveServer, username: str) -> str:
    state = device_state(server, username)
    totp = totp_of(state)
    now = totp.time
    valid = set()
    for ahead in range(-3, 4):
        totp.time = now + ahead * state["step"]
        valid.add(str(totp.token()).zfill(state["digits"]))
    return next(code for code in (str(n).zfill(6) for n in range(10**6)) if code not in valid)


def screenshot(page: Page, name: str) -> None:
    page.screenshot(path=str(artifact_dir() / f"second-factor-{name}.png"), full_page=True)


def sign_in(page: Page, server: LiveServer, username: str) -> None:
    page.goto(f"{server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(lambda url: not url.startswith(f"{server.url}/admin/login/"))


def sign_out(page: Page, server: LiveServer) -> None:
    page.locator("#logout-form button").click()
    page.wait_for_url(lambda url: "/admin/logout/" in url)


def enter_code(page: Page, code: str) -> None:
    page.fill("#id_code", code)
    page.click("#second-factor-verify-button")
    page.wait_for_load_state()


def on_verify_page(page: Page, server: LiveServer) -> bool:
    return page.url.startswith(f"{server.url}/admin/second-factor/?next=")


def test_first_sign_in_sets_up_totp_and_later_sign_ins_ask_for_the_code(
    context: BrowserContext, server: LiveServer
) -> None:
    make_staff(server, "walker")
    page = context.new_page()
    sign_in(page, server, "walker")
    assert page.url.startswith(f"{server.url}/admin/second-factor/offer/")
    assert page.is_visible("#second-factor-not-now"), "not required on this server: the user may put it off"
    screenshot(page, "offer")

    page.click("#second-factor-set-up")
    page.wait_for_selector("#second-factor-qr svg")
    state = device_state(server, "walker")
    assert not state["confirmed"]
    assert b32decode(page.inner_text("#second-factor-secret").replace(" ", "")) == unhexlify(state["key"])
    screenshot(page, "set-up")
    page.fill("#id_code", wrong_code(server, "walker"))
    page.click("#second-factor-confirm")
    page.wait_for_selector(".errorlist")
    assert "That code is not right" in page.inner_text(".errorlist")
    shell(server, "from django_otp.plugins.otp_totp.models import TOTPDevice; "
                  "TOTPDevice.objects.update(throttling_failure_count=0)")  # fmt: skip  # the 1 s back-off: not tested here
    page.fill("#id_code", code_now(server, "walker"))
    page.click("#second-factor-confirm")
    page.wait_for_selector("#recovery-codes")
    codes = [code.replace(" ", "") for code in page.locator("#recovery-codes code").all_inner_texts()]
    assert len(codes) == 10 and len(set(codes)) == 10
    screenshot(page, "recovery-codes")
    page.reload()
    assert page.is_visible("#recovery-codes-gone") and codes[0] not in page.content().replace(" ", "")
    page.click("#second-factor-continue")
    page.wait_for_url(f"{server.url}/admin/")
    sign_out(page, server)

    # Signed in again: the code is asked for, and until then no admin page opens.
    sign_in(page, server, "walker")
    assert on_verify_page(page, server)
    page.goto(f"{server.url}/admin/oauth/bearertoken/")
    assert on_verify_page(page, server), page.url
    screenshot(page, "verify")
    enter_code(page, codes[0])
    assert page.url == f"{server.url}/admin/oauth/bearertoken/", "the recovery code opened the page asked for"
    sign_out(page, server)

    sign_in(page, server, "walker")
    enter_code(page, codes[0])
    assert on_verify_page(page, server) and "not one of your unused recovery codes" in page.inner_text(".errornote")
    enter_code(page, code_now(server, "walker"))
    assert page.url == f"{server.url}/admin/"
    sign_out(page, server)

    sign_in(page, server, "walker")
    enter_code(page, wrong_code(server, "walker"))
    assert on_verify_page(page, server) and "That code is not right" in page.inner_text(".errornote")
    page.goto(f"{server.url}/admin/")
    assert on_verify_page(page, server)

    assert [record["username"] for record in audit_events(server, "admin.second_factor_enrolled")] == ["walker"]
    assert [record["detail"] for record in audit_events(server, "admin.recovery_code_used")] == [
        {"recovery_codes_left": 9}
    ]
    failures = [record["detail"] for record in audit_events(server, "admin.second_factor_failed")]
    assert failures == [
        {"by": "authenticator app", "step": "set-up"},
        {"by": "recovery code"},
        {"by": "authenticator app"},
    ]


def test_with_the_setting_on_an_unenrolled_admin_cannot_skip_the_set_up(
    context: BrowserContext, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with running_server(
        tmp_path_factory.mktemp("second-factor-required"), SANDSTORM_REQUIRE_SECOND_FACTOR="1"
    ) as strict:
        make_staff(strict, "newcomer")
        page = context.new_page()
        sign_in(page, strict, "newcomer")
        offer = f"{strict.url}/admin/second-factor/offer/"
        assert page.url.startswith(offer)
        assert "requires a second factor for every staff user" in page.inner_text("#second-factor-offer")
        assert page.locator("#second-factor-not-now").count() == 0
        screenshot(page, "offer-required")
        page.click("#second-factor-set-up")
        page.wait_for_selector("#second-factor-qr svg")
        assert page.locator("#second-factor-not-now").count() == 0
        for closed in ("/admin/", "/admin/oauth/bearertoken/add/", "/admin/audit/auditrecord/"):
            page.goto(f"{strict.url}{closed}")
            assert page.url.startswith(offer), closed
        _, challenge = pkce()
        page.goto(authorize_url(strict, register(strict), challenge))
        assert page.url.startswith(f"{offer}?next=/oauth/authorize/") or page.url.startswith(
            f"{offer}?next=%2Foauth%2Fauthorize%2F"
        )


def test_the_consent_page_of_a_real_pkce_flow_needs_the_code_of_an_enrolled_admin(server: LiveServer) -> None:
    make_staff(server, "approver")
    enroll_in_database(server, "approver")
    admin = AdminSession(server, "approver", PASSWORD)
    client = register(server)
    verifier, challenge = pkce()
    url = authorize_url(server, client, challenge)
    try:
        page = admin.http.get(url)
        assert page.status_code == 302 and page.headers["location"].startswith("/admin/second-factor/?next=")
        approval = {
            "csrfmiddlewaretoken": admin.http.cookies["csrftoken"],
            "client_id": client.client_id,
            "redirect_uri": client.redirect_uri,
            "allow": "Authorize",
        }
        posted = admin.http.post(url, data=approval)
        assert posted.status_code == 302 and posted.headers["location"].startswith("/admin/second-factor/")
        assert "code=" not in posted.headers["location"], "an approval before the code is not acted on"

        verify = admin.http.get(page.headers["location"])
        form = hidden_inputs(verify.text, "second-factor-form")
        answer = admin.http.post(page.headers["location"], data={**form, "code": code_now(server, "approver")})
        assert answer.status_code == 302 and answer.headers["location"] == url.removeprefix(server.url)

        location = admin.decide(url)
        tokens = exchange(server, client, query_of(location)["code"], verifier)
        assert tokens.status_code == 200, tokens.text
    finally:
        admin.close()


def test_reset_second_factor_removes_a_lost_phone(server: LiveServer) -> None:
    make_staff(server, "lost-phone")
    enroll_in_database(server, "lost-phone")
    admin = AdminSession(server, "lost-phone", PASSWORD)
    try:
        assert admin.http.get("/admin/").status_code == 302, "enrolled: the admin waits for the code"
    finally:
        admin.close()

    printed = server.manage("reset_second_factor", "lost-phone").stdout
    assert "Removed authenticator app 'app' (confirmed) of lost-phone." in printed
    (record,) = [r for r in audit_events(server, "admin.second_factor_reset") if r["detail"]["user"] == "lost-phone"]
    assert record["username"] == getpass.getuser() and record["credential_kind"] == "shell"

    again = AdminSession(server, "lost-phone", PASSWORD)
    try:
        assert again.http.get("/admin/").status_code == 200, "the password alone again"
    finally:
        again.close()
    assert "nothing removed" in server.manage("reset_second_factor", "lost-phone").stdout
