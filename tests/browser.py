"""Headless Chromium for page tests: Debian's `chromium` package driven by Playwright (no browser downloads)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from tests.live import LiveServer

T = TypeVar("T")

CHROMIUM = "/usr/bin/chromium"
# Flags for a sandboxed machine as root with no network: no sandbox, no background traffic.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def past_the_second_factor_offer(page: Page, server: LiveServer) -> None:
    """After "Log in" with the right password: wait for the browser to leave the sign-in page and, on the offer to
    set up a second factor (an unenrolled staff user sees it once per sign-in), press "Not now"."""
    page.wait_for_url(lambda url: not url.startswith(f"{server.url}/admin/login/"))
    if page.url.startswith(f"{server.url}/admin/second-factor/offer/"):
        page.click("#second-factor-not-now")
        page.wait_for_url(lambda url: not url.startswith(f"{server.url}/admin/second-factor/"))


def log_in_as_admin(page: Page, server: LiveServer, username: str = "admin", password: str | None = None) -> None:
    page.goto(f"{server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password or server.admin_password)
    page.click("input[type=submit]")
    past_the_second_factor_offer(page, server)
    page.wait_for_url(f"{server.url}/admin/")


def wait_until(page: Page, check: Callable[[], T | None], what: str, deadline: float = 15.0) -> T:
    """tests.live.poll for a page: Playwright delivers the page's events (socket frames) only while it is called, so
    the waits between checks are its own."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        page.wait_for_timeout(50)
