"""Shared fixtures. Live-server fixtures (a real Daphne on a free port) live in tests/live.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _live_server_helper() -> None:
    """Turn off pytest-django's helper for its own `live_server`, a name our fixture below takes over."""


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real server for the whole session (Daphne, free port, temporary state dir and workspace)."""
    from tests.live import running_server

    with running_server(tmp_path_factory.mktemp("live")) as server:
        yield server
