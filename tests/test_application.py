"""The /mcp application factory (mcpserver/application.py): what depends on settings is built when an application
is built, not when a module is imported, so one process can build applications of different settings."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from starlette.types import Message, Scope

from mcpserver import application, services
from mcpserver.application import McpApplication, build_mcp_application
from mcpserver.executor.remote import ExecutorLost, RemoteExecutor
from oauth import agent_identity
from oauth.agent_identity import agent_user, remember_agent_user
from oauth.credentials import Principal

PRINCIPAL = Principal(
    user_id=1,
    username="agent",
    credential_kind="bearer",
    credential_id=7,
    credential_name="t",
    scopes=frozenset({"mcp"}),
)
STRICT = {
    "RATE_LIMIT_PER_MINUTE": 1,
    "MAX_CONCURRENT_CALLS": 2,
    "RESULT_CAP_BYTES": 8192,
    "MAX_SESSIONS_PER_CREDENTIAL": 3,
}
LENIENT = {
    "RATE_LIMIT_PER_MINUTE": 50,
    "MAX_CONCURRENT_CALLS": 9,
    "RESULT_CAP_BYTES": 65536,
    "MAX_SESSIONS_PER_CREDENTIAL": 11,
}


@pytest.fixture(autouse=True)
def _nothing_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """No application of another test, and this test's own forgotten after it (with what it told the consent page)."""
    monkeypatch.setattr(services, "_registered", None)
    monkeypatch.setattr(agent_identity, "_agent_user", None)


@pytest.fixture(autouse=True)
def _any_token_is_the_principal(monkeypatch: pytest.MonkeyPatch) -> None:
    async def authenticate(raw: str, **request: str) -> Principal:
        return PRINCIPAL

    monkeypatch.setattr(application, "build_authenticator", lambda: authenticate)


def built(settings: dict[str, int]) -> McpApplication:
    with override_settings(**settings):
        return build_mcp_application()


def get_mcp(app: McpApplication) -> int:
    """The status of a GET /mcp with a bearer token, driven in-process."""
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/mcp",
        "headers": [(b"host", b"127.0.0.1:8080"), (b"authorization", b"Bearer sst_anything")],
        "client": ("127.0.0.1", 5000),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def request() -> None:
        await app.asgi(scope, receive, send)

    asyncio.run(request())
    return int(sent[0]["status"])


def test_two_applications_built_with_different_settings_get_different_limits() -> None:
    strict, lenient = built(STRICT), built(LENIENT)
    assert (strict.services.rate_limiter.per_minute, lenient.services.rate_limiter.per_minute) == (1, 50)
    assert (strict.services.concurrency.limit, lenient.services.concurrency.limit) == (2, 9)
    assert (strict.services.result_cap, lenient.services.result_cap) == (8192, 65536)
    assert (strict.services.sessions.per_credential, lenient.services.sessions.per_credential) == (3, 11)


def test_each_application_answers_by_its_own_rate_limit() -> None:
    strict, lenient = built(STRICT), built(LENIENT)
    assert asyncio.run(strict.services.rate_limiter.admit(PRINCIPAL.key)) == 0  # its one request of the minute
    assert asyncio.run(lenient.services.rate_limiter.admit(PRINCIPAL.key)) == 0
    assert get_mcp(strict) == 429
    assert asyncio.run(lenient.services.rate_limiter.admit(PRINCIPAL.key)) == 0  # the other's limit is untouched


def test_the_services_of_the_last_application_built_are_the_running_ones() -> None:
    built(STRICT)
    lenient = built(LENIENT)
    assert services.running_services() is lenient.services


def test_without_an_application_built_the_running_services_are_a_clear_error() -> None:
    with pytest.raises(ImproperlyConfigured, match="no MCP application was built in this process"):
        services.running_services()


class AnsweringExecutor(RemoteExecutor):
    """An executor client whose ping answers `identity` (or is lost, for None) without an executor behind it."""

    def __init__(self, identity: dict[str, Any] | None) -> None:
        super().__init__("/nowhere", "/tmp")
        self._identity = identity

    async def identity(self) -> dict[str, Any]:
        if self._identity is None:
            raise ExecutorLost("no answer")
        return self._identity


def announced(identity: dict[str, Any] | None) -> str | None:
    """What the consent page reads after the start-up announcement of an executor answering `identity`."""
    app = built(LENIENT)
    stub = dataclasses.replace(app.services, executor=AnsweringExecutor(identity), executor_child=None)
    asyncio.run(application.announce_executor(stub))
    return agent_user()


def test_the_start_up_announcement_tells_the_consent_page_who_runs_the_tools() -> None:
    assert announced({"pid": 1, "user": "sandstorm-agent", "uid": 990, "root": "/tmp"}) == "sandstorm-agent"


def test_an_executor_that_does_not_answer_leaves_the_consent_page_no_user() -> None:
    remember_agent_user("someone-earlier")
    assert announced(None) is None
