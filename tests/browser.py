"""Headless Chromium for page tests: Debian's `chromium` package driven by Playwright (no browser downloads)."""

from __future__ import annotations

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
