"""The login throttle as people meet it, in headless Chromium on a live server: an attacker guessing the admin's
password from other addresses (127.0.0.2 and up: loopback has a whole /8) does not stop the admin signing in from
the address they used before, and someone who mistypes is told how long to wait."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx2
import pytest
from playwright.sync_api import Browser, Page

from tests.browser import log_in_as_admin, past_the_second_factor_offer
from tests.live import LiveServer, running_server
from tests.oauth_flow import hidden_inputs, shell

pytestmark = [pytest.mark.live, pytest.mark.browser]

ATTACKERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]  # with 5 guesses each, past the per-username ceiling


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("login-throttle")) as live:
        yield live


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    yield context.new_page()
    context.close()


def guess(server: LiveServer, source: str, username: str, password: str) -> httpx2.Response:
    """One login attempt over HTTP from the loopback address `source`."""
    transport = httpx2.HTTPTransport(local_address=source)
    with httpx2.Client(base_url=server.url, transport=transport, timeout=30) as http:
        form = hidden_inputs(http.get("/admin/login/").text, "login-form")
        return http.post("/admin/login/", data={**form, "username": username, "password": password, "next": "/admin/"})


def sign_in(page: Page, server: LiveServer, username: str, password: str) -> None:
    page.goto(f"{server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_load_state()


def test_an_attacker_elsewhere_does_not_stop_the_admin_at_a_known_address(browser: Browser, server: LiveServer) -> None:
    first = browser.new_context()
    log_in_as_admin(first.new_page(), server)  # 127.0.0.1 becomes a known address of admin's
    first.close()

    for attacker in ATTACKERS:
        for attempt in range(5):
            assert guess(server, attacker, "admin", f"guess-{attempt}").status_code == 200
    refused = guess(server, ATTACKERS[0], "admin", server.admin_password)
    assert refused.status_code == 200 and "Try again in" in refused.text, "the attacker's own address waits"
    respelled = guess(server, ATTACKERS[0], " ａｄｍｉｎ ", server.admin_password)
    assert respelled.status_code == 200 and "Try again in" in respelled.text, "a respelled name waits as well"

    again = browser.new_context()
    page = again.new_page()
    sign_in(page, server, "admin", server.admin_password)
    past_the_second_factor_offer(page, server)
    assert page.url == f"{server.url}/admin/", page.inner_text("body")[:500]
    assert "Tokens, clients and audit" in page.inner_text("body")
    again.close()


def test_someone_who_mistypes_is_told_how_long_to_wait(page: Page, server: LiveServer) -> None:
    shell(server, "from django.contrib.auth import get_user_model; "
                  "get_user_model().objects.create_user('typist', password='typist-password-123', is_staff=True)")  # fmt: skip
    for attempt in range(5):
        sign_in(page, server, "typist", f"typo-{attempt}")
        assert "Please enter the correct username and password" in page.inner_text(".errornote")
    sign_in(page, server, "typist", "typist-password-123")
    note = page.inner_text(".errornote")
    assert "Too many failed sign-in attempts" in note and re.search(r"Try again in 1[0-5] seconds\.", note), note
    assert page.url.startswith(f"{server.url}/admin/login/")
