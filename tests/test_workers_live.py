"""Two workers (SANDSTORM_WORKERS=2) as production runs them: Daphne on a Unix socket each, one executor, one
PostgreSQL database, one Redis, and Debian's Caddy serving the installer's site (deploy/Caddyfile) in front.

Sessions opened through Caddy spread over both workers and every later request of a session (calls, progress,
cancellation) reaches the worker that holds it; the rate limit and the calls in flight count across both; a
revocation made on one worker stops a call on the other within a second; an approval card and the Live page show,
on a page served by either worker, the calls of both."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from playwright.sync_api import Browser, Page

from tests.browser import log_in_as_admin, wait_until
from tests.database import requires_postgres
from tests.live import (
    INITIALIZE,
    MCP_HEADERS,
    LiveServer,
    apoll,
    auth_headers,
    free_port,
    live_group_members,
    live_pids_with,
    make_server,
    text_of,
)
from tests.redis_server import RedisServer, running_redis, unique_prefix
from tests.test_deploy_caddy_live import caddy_in_front, daphne_on_socket, executor_on_socket

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.anyio, requires_postgres]
RATE_LIMIT = 60  # requests per minute per credential, over both workers
CONCURRENT = 2  # calls in flight per credential, over both workers
SESSIONS = 4  # open MCP sessions per credential, over both workers
DEADLINE = 20.0
POLICY = {"rules": [{"id": "workers-ask", "decision": "ask", "commands": ["printf"], "description": "printing"}]}


@dataclass
class Workers:
    url: str  # Caddy's
    servers: list[LiveServer]  # worker 1 and worker 2, by number
    redis: RedisServer  # theirs alone: the last test stops it

    @property
    def first(self) -> LiveServer:
        return self.servers[0]

    def socket(self, number: int) -> Path:
        return Path(self.servers[number - 1].env["TEST_WORKER_SOCKET"])

    def new_token(self, name: str) -> str:
        return self.first.create_token(f"{name}-{uuid.uuid4().hex[:8]}")

    def direct(self, number: int) -> httpx2.Client:
        """HTTP straight to worker `number`'s socket, past Caddy (with the public Host, as Caddy sends it)."""
        return httpx2.Client(
            transport=httpx2.HTTPTransport(uds=str(self.socket(number))), base_url=self.url, timeout=15
        )


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    root = tmp_path_factory.mktemp("workers")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run = root / "run"
    workspace = root / "workspace"
    workspace.mkdir()
    with contextlib.ExitStack() as stack:
        _, executor_socket = stack.enter_context(executor_on_socket(root, workspace))
        (root / "redis").mkdir()
        redis = stack.enter_context(running_redis(root / "redis"))
        common = {
            "SANDSTORM_PUBLIC_URL": url,
            "SANDSTORM_EXECUTOR_SOCKET": str(executor_socket),
            "SANDSTORM_WORKSPACE_ROOT": str(workspace),
            "SANDSTORM_WORKERS": "2",
            "SANDSTORM_REDIS_URL": redis.url,
            "SANDSTORM_REDIS_PREFIX": unique_prefix(),
            "SANDSTORM_RATE_LIMIT": str(RATE_LIMIT),
            "SANDSTORM_MAX_CONCURRENT_CALLS": str(CONCURRENT),
            "SANDSTORM_MAX_SESSIONS_PER_CREDENTIAL": str(SESSIONS),
            "SANDSTORM_APPROVAL_HOLD": "60",
            "SANDSTORM_APPROVAL_TIMEOUT": "120",
        }
        first = make_server(root / "w1", SANDSTORM_WORKER="1", TEST_WORKER_SOCKET=str(run / "worker-1.sock"), **common)
        second = make_server(
            root / "w2",
            SANDSTORM_WORKER="2",
            TEST_WORKER_SOCKET=str(run / "worker-2.sock"),
            # One installation: the state dir (keys), database, bootstrap token and admin password are the first's.
            SANDSTORM_STATE_DIR=first.env["SANDSTORM_STATE_DIR"],
            DATABASE_URL=first.env["DATABASE_URL"],
            SANDSTORM_MCP_TOKEN=first.token,
            SANDSTORM_ADMIN_PASSWORD=first.admin_password,
            **common,
        )
        second.token, second.admin_password = first.token, first.admin_password
        for server in (first, second):
            stack.enter_context(daphne_on_socket(server, Path(server.env["TEST_WORKER_SOCKET"])))
        stack.enter_context(caddy_in_front(root, run, port, workers=2))
        policy = root / "policy.json"
        policy.write_text(json.dumps(POLICY))
        first.manage("policy_load", str(policy))
        yield Workers(url, [first, second], redis)


@contextlib.asynccontextmanager
async def session(url: str, token: str, **options: Any) -> AsyncIterator[tuple[Client, str]]:
    """The official SDK client in a 2025-11-25 session through Caddy; yields it and its session id."""
    ids: list[str] = []

    async def note(response: httpx2.Response) -> None:
        if not ids and response.headers.get("mcp-session-id"):
            ids.append(response.headers["mcp-session-id"])

    http = httpx2.AsyncClient(
        headers=auth_headers(token), timeout=httpx2.Timeout(60, read=330), event_hooks={"response": [note]}
    )
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy", **options) as client:
        yield client, ids[0]


@contextlib.asynccontextmanager
async def session_direct(workers: Workers, token: str, number: int) -> AsyncIterator[Client]:
    """The SDK client in a session of worker `number`, past Caddy (every request to that worker's socket)."""
    http = httpx2.AsyncClient(
        transport=httpx2.AsyncHTTPTransport(uds=str(workers.socket(number))),
        headers=auth_headers(token),
        timeout=httpx2.Timeout(60, read=330),
    )
    async with http, Client(streamable_http_client(f"{workers.url}/mcp", http_client=http), mode="legacy") as client:
        yield client


async def session_on(stack: AsyncExitStack, url: str, token: str, worker: int, **options: Any) -> Client:
    """A session held by worker `worker`: Caddy spreads new sessions over the workers; others are closed again."""
    for _ in range(8):
        attempt = AsyncExitStack()
        client, session_id = await attempt.enter_async_context(session(url, token, **options))
        if session_id.startswith(f"w{worker}-"):
            stack.push_async_exit(attempt)
            return client
        await attempt.aclose()
    raise AssertionError(f"eight new sessions through Caddy and none on worker {worker}")


async def test_sessions_spread_over_both_workers_and_each_keeps_working_through_caddy(workers: Workers) -> None:
    token = workers.new_token("spread")
    tags = []
    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(4):
            client, session_id = await stack.enter_async_context(session(workers.url, token))
            tags.append(session_id.split("-", 1)[0])
            clients.append(client)
        for number, client in enumerate(clients):
            for call in range(3):
                result = await client.call_tool("terminal_exec", {"command": f"echo s{number}-{call}"})
                assert text_of(result) == f"stdout:\ns{number}-{call}\n\nexit_code: 0"
    assert sorted(tags) == ["w1", "w1", "w2", "w2"]  # round robin for what opens a session


def test_a_session_is_held_by_its_worker_alone_and_caddy_routes_by_its_id(workers: Workers) -> None:
    headers = {**MCP_HEADERS, **auth_headers(workers.new_token("routed")), "Mcp-Protocol-Version": "2025-11-25"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    for _ in range(2):  # one session on each worker
        opened = httpx2.post(f"{workers.url}/mcp", json=INITIALIZE, headers=headers, timeout=15)
        assert opened.status_code == 200
        session_id = opened.headers["mcp-session-id"]
        owner = int(session_id.split("-", 1)[0].removeprefix("w"))
        with_session = {**headers, "Mcp-Session-Id": session_id}
        with workers.direct(owner) as own, workers.direct(3 - owner) as other:
            assert own.post("/mcp", json=listing, headers=with_session).status_code == 200
            assert other.post("/mcp", json=listing, headers=with_session).status_code == 404
        for _ in range(3):
            assert httpx2.post(f"{workers.url}/mcp", json=listing, headers=with_session, timeout=15).status_code == 200
    # An id naming no worker of this installation is an unknown session, answered by a worker.
    unknown = {**headers, "Mcp-Session-Id": "w7-" + uuid.uuid4().hex}
    assert httpx2.post(f"{workers.url}/mcp", json=listing, headers=unknown, timeout=15).status_code == 404


@pytest.mark.parametrize("worker", [1, 2])
async def test_progress_and_cancellation_reach_the_worker_holding_the_session(workers: Workers, worker: int) -> None:
    token = workers.new_token(f"progress-{worker}")
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async with AsyncExitStack() as stack:
        client = await session_on(stack, workers.url, token, worker)
        command = "for i in 1 2 3; do echo line$i; sleep 0.4; done"
        result = await client.call_tool("terminal_exec", {"command": command}, progress_callback=on_progress)
        assert text_of(result) == "stdout:\nline1\nline2\nline3\n\nexit_code: 0"
        assert len(notes) >= 2 and "line1" in "".join(notes)

        marker = uuid.uuid4().hex
        async with anyio.create_task_group() as group:
            group.start_soon(client.call_tool, "terminal_exec", {"command": f"sleep 300; : {marker}", "timeout": 290})
            pids = await apoll(lambda: live_pids_with(marker), DEADLINE, "the command to start")
            group_id = os.getpgid(pids[0])
            group.cancel_scope.cancel()  # the client sends notifications/cancelled, with the session's id
        await apoll(lambda: not live_group_members(group_id), DEADLINE, "the cancelled command to end")
        again = await client.call_tool("terminal_exec", {"command": "echo still"})
        assert text_of(again) == "stdout:\nstill\n\nexit_code: 0"


def test_the_rate_limit_counts_the_requests_of_both_workers_together(workers: Workers) -> None:
    token = workers.new_token("rate")
    headers = {**auth_headers(token), "Accept": "text/event-stream"}
    with workers.direct(1) as first, workers.direct(2) as second:
        answers = [(first if number % 2 else second).get("/mcp", headers=headers) for number in range(RATE_LIMIT)]
        assert all(answer.status_code != 429 for answer in answers), [answer.status_code for answer in answers]
        over = [first.get("/mcp", headers=headers), second.get("/mcp", headers=headers)]
    assert [answer.status_code for answer in over] == [429, 429]  # each worker saw only half of the limit
    assert all(0 < int(answer.headers["retry-after"]) <= 60 for answer in over)
    assert httpx2.get(f"{workers.url}/mcp", headers=headers, timeout=15).status_code == 429


async def test_calls_in_flight_count_across_both_workers(workers: Workers) -> None:
    token = workers.new_token("in-flight")
    marker = uuid.uuid4().hex
    async with AsyncExitStack() as stack:
        on_first = await session_on(stack, workers.url, token, 1)
        on_second = await session_on(stack, workers.url, token, 2)
        async with anyio.create_task_group() as group:
            for client in (on_first, on_second):
                group.start_soon(
                    client.call_tool, "terminal_exec", {"command": f"sleep 300; : {marker}", "timeout": 290}
                )
            await apoll(lambda: len(live_pids_with(marker)) >= CONCURRENT, DEADLINE, "a call running on each worker")
            for client in (on_first, on_second):
                refused = await client.call_tool("terminal_exec", {"command": "echo one-too-many"})
                assert refused.is_error
                assert f"already has {CONCURRENT} tool calls running" in text_of(refused)
            group_ids = {os.getpgid(pid) for pid in live_pids_with(marker)}
            group.cancel_scope.cancel()
        await calls_ended(group_ids)
        freed = await on_second.call_tool("terminal_exec", {"command": "echo freed"})
        assert text_of(freed) == "stdout:\nfreed\n\nexit_code: 0"


async def calls_ended(group_ids: set[int]) -> None:
    """Until the commands of cancelled calls have ended, and a moment for their answers to reach the clients."""
    await apoll(lambda: not any(live_group_members(group_id) for group_id in group_ids), DEADLINE, "the calls to end")
    await anyio.sleep(0.5)


def open_raw_session(client: httpx2.Client, headers: dict[str, str]) -> str:
    """initialize, initialized and one listing, straight to a worker: a used, idle session; its id."""
    opened = client.post("/mcp", json=INITIALIZE, headers=headers)
    assert opened.status_code == 200, opened.text
    with_session = {**headers, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert client.post("/mcp", json=initialized, headers=with_session).status_code == 202
    assert client.post("/mcp", json=LISTING, headers=with_session).status_code == 200
    return opened.headers["mcp-session-id"]


LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


async def test_the_session_cap_counts_both_workers_and_room_is_made_in_the_other(workers: Workers) -> None:
    """Worker 1 holds two busy sessions, worker 2 two idle ones: at the cap of four, a new session on worker 1
    ends worker 2's least recently used idle session."""
    token = workers.new_token("sessions")
    headers = {**MCP_HEADERS, **auth_headers(token), "Mcp-Protocol-Version": "2025-11-25"}
    marker = uuid.uuid4().hex
    with workers.direct(1) as first, workers.direct(2) as second:
        idle = [open_raw_session(second, headers) for _ in range(2)]
        async with AsyncExitStack() as stack:
            busy = [await stack.enter_async_context(session_direct(workers, token, 1)) for _ in range(2)]
            async with anyio.create_task_group() as group:
                for client in busy:
                    arguments = {"command": f"sleep 300; : {marker}", "timeout": 290}
                    group.start_soon(client.call_tool, "terminal_exec", arguments)
                await apoll(lambda: len(live_pids_with(marker)) >= 2, DEADLINE, "two busy sessions on worker 1")
                newest = await anyio.to_thread.run_sync(open_raw_session, first, headers)
                answers = [
                    second.post("/mcp", json=LISTING, headers={**headers, "Mcp-Session-Id": session_id}).status_code
                    for session_id in idle
                ]
                group_ids = {os.getpgid(pid) for pid in live_pids_with(marker)}
                group.cancel_scope.cancel()
            # The clients stay open until the cancelled calls are answered (an answer to a closed client is an error).
            await calls_ended(group_ids)
    assert newest.startswith("w1-")
    assert answers == [404, 200]  # the older idle session on worker 2 made room; the other is untouched


def sign_in(client: httpx2.Client, password: str) -> None:
    """The console's sign-in form, as a browser sends it."""
    client.get("/admin/login/")
    answer = client.post(
        "/admin/login/",
        data={"username": "admin", "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
    )
    assert answer.status_code == 302, answer.text[:500]


async def test_a_revocation_made_on_one_worker_stops_a_call_on_the_other_within_a_second(workers: Workers) -> None:
    name = f"revoked-{uuid.uuid4().hex[:8]}"
    token = workers.first.create_token(name)
    (row,) = workers.first.database.query("SELECT id FROM oauth_bearertoken WHERE name = %s", name)
    marker = uuid.uuid4().hex
    results: list[CallToolResult] = []
    async with AsyncExitStack() as stack:
        client = await session_on(stack, workers.url, token, 2)

        async def long_call() -> None:
            results.append(
                await client.call_tool("terminal_exec", {"command": f"sleep 300; : {marker}", "timeout": 290})
            )

        async with anyio.create_task_group() as group:
            group.start_soon(long_call)
            await apoll(lambda: live_pids_with(marker), DEADLINE, "the call to start on worker 2")

            def revoke_on_worker_1() -> float:
                with workers.direct(1) as console:
                    sign_in(console, workers.first.admin_password)
                    page = f"/admin/oauth/bearertoken/{row['id']}/revoke/"
                    console.get(page)
                    answer = console.post(page, data={"csrfmiddlewaretoken": console.cookies["csrftoken"]})
                    assert answer.status_code == 302, answer.text[:500]
                return time.monotonic()

            revoked_at = await anyio.to_thread.run_sync(revoke_on_worker_1)
            await apoll(lambda: results, DEADLINE, "the call on worker 2 to end")
            ended_after = time.monotonic() - revoked_at
    assert results[0].is_error and "cancelled" in text_of(results[0])
    assert ended_after < 1.0, f"the call on the other worker ended {ended_after:.2f} s after the revocation"


# --- the console, in Chromium, served by whichever worker Caddy picks -------------------------------------------


@pytest.fixture
def console(browser: Browser, workers: Workers) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    log_in_as_admin(page, replace(workers.first, port=int(workers.url.rsplit(":", 1)[1])))
    yield page
    context.close()


def call_on(
    pool: ThreadPoolExecutor, workers: Workers, token: str, worker: int, command: str
) -> Future[CallToolResult | BaseException]:
    """`terminal_exec command` in a session of `worker` (straight to it: the page is what goes through Caddy here), in
    a thread (Playwright's sync API holds this one)."""

    async def call() -> CallToolResult | BaseException:
        async with session_direct(workers, token, worker) as client:
            try:
                return await client.call_tool("terminal_exec", {"command": command, "timeout": 290})
            except MCPError as error:  # a stopped call may end in an error the client raises
                return error

    return pool.submit(anyio.run, call)


def done(future: Future[CallToolResult | BaseException]) -> Callable[[], CallToolResult | BaseException | None]:
    return lambda: future.result() if future.done() else None


@pytest.mark.browser
def test_approval_cards_and_running_calls_of_both_workers_show_and_are_decided_on_one_page(
    console: Page, workers: Workers
) -> None:
    """Calls on both workers, one page: whichever worker serves the page's socket, one of each pair is the other's."""
    token = workers.new_token("console")
    with ThreadPoolExecutor(max_workers=4) as pool:
        console.goto(f"{workers.url}/admin/")
        markers = {worker: uuid.uuid4().hex for worker in (1, 2)}
        asked = {worker: call_on(pool, workers, token, worker, f"printf '%s' {markers[worker]}") for worker in (1, 2)}
        for worker, future in asked.items():
            card = console.locator(".approval-card", has_text=markers[worker])
            card.wait_for(timeout=DEADLINE * 1000)
            card.get_by_role("button", name="Approve once").click()
            result = wait_until(console, done(future), f"the approved call on worker {worker}", DEADLINE)
            assert isinstance(result, CallToolResult) and not result.is_error, result
            assert text_of(result).startswith(f"stdout:\n{markers[worker]}")

        sleepers = {worker: uuid.uuid4().hex[:12] for worker in (1, 2)}
        running = {
            worker: call_on(pool, workers, token, worker, f"sleep 300; : {sleepers[worker]}") for worker in (1, 2)
        }
        wait_until(
            console, lambda: len(live_pids_with(sleepers[1])) + len(live_pids_with(sleepers[2])) >= 2, "two calls"
        )
        console.goto(f"{workers.url}/admin/live/")  # opened after they started: the snapshot holds both workers'
        for worker, future in running.items():
            row = console.locator("#live-calls .live-call", has_text=sleepers[worker])
            row.wait_for(timeout=DEADLINE * 1000)
            row.get_by_role("button", name="Stop").click()
            result = wait_until(console, done(future), f"the stopped call on worker {worker}", DEADLINE)
            assert not isinstance(result, CallToolResult) or result.is_error, result
            assert not live_pids_with(sleepers[worker])


# --- last: without Redis -------------------------------------------------------------------------------------------


def test_without_redis_health_says_so_and_requests_are_refused_not_let_past_the_limits(workers: Workers) -> None:
    for number in (1, 2):
        with workers.direct(number) as worker:
            health = worker.get("/health").json()
        assert health["worker"] == number and health["redis"] == {"ok": True, "error": None}
    workers.redis.stop()
    headers = {**MCP_HEADERS, **auth_headers(workers.new_token("no-redis")), "Mcp-Protocol-Version": "2025-11-25"}
    for number in (1, 2):
        with workers.direct(number) as worker:
            health = worker.get("/health")
            assert health.status_code == 503
            assert health.json()["redis"] == {
                "ok": False,
                "error": "Redis does not answer; requests are refused until it is back",
            }
            refused = worker.post("/mcp", json=INITIALIZE, headers=headers)
        assert refused.status_code == 503 and refused.json()["error"] == "temporarily_unavailable"
