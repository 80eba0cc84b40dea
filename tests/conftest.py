"""Shared fixtures. Live-server fixtures (a real Daphne on a free port) live in tests/live.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
