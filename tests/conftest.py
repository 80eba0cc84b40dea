"""Shared fixtures. Live-server fixtures (a real Daphne on a free port) live in tests/live.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its one tier (tests/tiers.py): the marker it carries, or that of the fixtures it uses; and mark
    those whose outcome cannot depend on the database (`same_on_any_database`)."""
    from tests.tiers import ANY_DATABASE, same_on_any_database, tier_of

    wrong = []
    for item in items:
        markers = {mark.name for mark in item.iter_markers()}
        fixtures = set(getattr(item, "fixturenames", ()))
        try:
            tier = tier_of(markers, fixtures)
        except ValueError as error:
            wrong.append(f"{item.nodeid} {error}")
            continue
        if tier not in markers:
            item.add_marker(tier)
        if ANY_DATABASE not in markers and same_on_any_database(tier, markers, fixtures):
            item.add_marker(ANY_DATABASE)
    if wrong:
        raise pytest.UsageError("tests with a wrong tier:\n" + "\n".join(wrong))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Note the tier of the test about to be set up, for tests.tiers.require (before its fixtures start servers)."""
    from tests import tiers

    tiers.current = next((tier for tier in tiers.TIERS if item.get_closest_marker(tier)), None)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _quick_password_hashes() -> Iterator[None]:
    """Passwords of this process's test users hashed quickly: the default hasher is slow on purpose, and the tests
    that sign a user in would spend most of their time in it. Live servers keep their own settings."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture
async def mcp_app(tmp_path: Path, transactional_db: None, anyio_backend: str) -> AsyncIterator[InProcessServer]:
    """The /mcp application in this process (tests/inprocess.py), with a workspace of this test's own."""
    from tests.inprocess import serve_in_process

    async with serve_in_process(tmp_path / "workspace") as server:
        yield server


@pytest.fixture(autouse=True)
def _no_policy_of_another_test() -> None:
    """This process's cached command policy is read again: a test's database starts without one."""
    from mcpserver.policy_source import POLICY

    POLICY.forget()


@pytest.fixture(autouse=True)
def _live_server_helper() -> None:
    """Turn off pytest-django's helper for its own `live_server`, a name our fixture below takes over."""


@pytest.fixture(autouse=True)
def _anchor_file_of_its_own(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's audit anchors in a file of its own: the test database is rolled back after each test, so anchors
    of one test's records would look like records missing to the next."""
    from django.conf import settings

    monkeypatch.setattr(settings, "AUDIT_ANCHOR_FILE", tmp_path / "audit_anchors")


@pytest.fixture(autouse=True)
def _drop_live_databases() -> Iterator[None]:
    """Under PostgreSQL, drop the databases of the live servers this test made (servers of wider-scoped fixtures
    were made before this fixture started, and are dropped when the session ends)."""
    from tests.database import ON_POSTGRES, drop_databases_made_since, made_databases

    before = made_databases()
    yield
    if ON_POSTGRES:
        drop_databases_made_since(before)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, but PostgreSQL's dropped even while worker threads of the code under test
    (sync_to_async) still hold connections to it, which PostgreSQL would refuse."""
    yield
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND usename = current_user"
            )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for the session (tests/redis_server.py); tests keep apart by key prefix."""
    from tests.redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server for the whole session (Daphne, free port, temporary state dir and workspace)."""
    from tests.live import running_server

    with running_server(tmp_path_factory.mktemp("live")) as server:
        yield server


# --- the tool tests (tests/test_tools_*_live.py) ---------------------------------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import uuid  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from mcp import Client

    from tests.inprocess import InProcessServer
    from tests.live import LiveServer
    from tests.oauth_flow import AdminSession

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Sandstorm Test",
    "GIT_AUTHOR_EMAIL": "test@sandstorm.invalid",
    "GIT_COMMITTER_NAME": "Sandstorm Test",
    "GIT_COMMITTER_EMAIL": "test@sandstorm.invalid",
}


@pytest.fixture(scope="module")
def tool_token(live_server: LiveServer) -> str:
    """A full-scope token of this test module's own, so its calls have their own rate-limit window and call slots."""
    return live_server.create_token(f"tools-{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def tools_client(live_server: LiveServer, tool_token: str, anyio_backend: str) -> AsyncIterator[Client]:
    """The official SDK client, connected to the shared live server with `tool_token`."""
    from tests.live import mcp_client

    async with mcp_client(live_server.mcp_url, tool_token) as client:
        yield client


@pytest.fixture
def workspace_dir(live_server: LiveServer) -> Path:
    """A fresh directory in the live server's workspace, for this test alone (the server is shared)."""
    path = live_server.workspace / f"t-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    return path


@pytest.fixture
def git_env() -> dict[str, str]:
    """The environment for git commands a test runs itself: CI has no git identity."""
    return {**os.environ, **GIT_IDENTITY}


@pytest.fixture
def bare_remote(tmp_path: Path, git_env: dict[str, str]) -> Path:
    """A bare repository outside the workspace whose `main` holds one commit (README.md, "Initial commit")."""
    seed, bare = tmp_path / "seed", tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True, env=git_env)
    (seed / "README.md").write_text("seed\n")
    subprocess.run(["git", "add", "README.md"], cwd=seed, check=True, env=git_env)
    subprocess.run(["git", "commit", "-q", "-m", "Initial commit"], cwd=seed, check=True, env=git_env)
    subprocess.run(["git", "clone", "-q", "--bare", str(seed), str(bare)], check=True, env=git_env)
    return bare


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for one module; each test opens its own context.

    Module scope, not session: Playwright's sync API keeps an event loop running in this thread while it is open,
    which would stop the async tests of later modules from starting theirs.
    """
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def admin_page(browser: Any, live_server: LiveServer) -> Iterator[Any]:
    """A page of its own browser context, signed in to the admin of the session's live server."""
    from tests.browser import log_in_as_admin

    context = browser.new_context()
    page = context.new_page()
    log_in_as_admin(page, live_server)
    yield page
    context.close()


@pytest.fixture(scope="session")
def oauth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server shared by the OAuth modules that neither rotate nor prune (registration rate limit off)."""
    from tests.live import running_server

    with running_server(tmp_path_factory.mktemp("oauth"), SANDSTORM_REGISTRATION_RATE_LIMIT="0") as server:
        yield server


def pytest_unconfigure(config: pytest.Config) -> None:
    """Drop the live servers' PostgreSQL databases still left; remove the WAL side files Django leaves behind when
    it deletes this run's SQLite test database."""
    from django.conf import settings

    from tests.database import drop_databases_made_since

    drop_databases_made_since(frozenset())

    test_settings: dict[str, Any] = dict(settings.DATABASES["default"].get("TEST") or {})  # type: ignore[call-overload]  # django-stubs types the entry as object
    name = str(test_settings.get("NAME") or "")
    if name:
        for suffix in ("-wal", "-shm"):
            Path(name + suffix).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def admin(server: LiveServer) -> Iterator[AdminSession]:
    """An HTTP client logged in as `admin` on the module's `server` (OAuth modules), like a browser would be."""
    from tests.oauth_flow import AdminSession

    session = AdminSession(server)
    yield session
    session.close()
