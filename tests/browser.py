"""Headless Chromium for page tests: Debian's `chromium` package driven by Playwright (no browser downloads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from tests.live import LiveServer

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


def log_in_as_admin(page: Page, server: LiveServer) -> None:
    page.goto(f"{server.url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", server.admin_password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{server.url}/admin/")
