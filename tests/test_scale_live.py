"""Several server processes sharing one database, as behind one Caddy: what is shared (the audit chain, the
background-process registry, revocations, tokens) works across them, and what is not (an MCP session) stays in
the process that opened it. Runs on SQLite and, with DATABASE_URL, on PostgreSQL."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.live import (
    INITIALIZE,
    MCP_HEADERS,
    LiveServer,
    apoll,
    auth_headers,
    free_port,
    live_pids_with,
    make_replica,
    make_server,
    mcp_client,
    poll,
    text_of,
)

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.anyio]

PROCESSES = 3
CLIENTS_PER_PROCESS = 3
CALLS_PER_CLIENT = 8
DEADLINE = 20.0
BACKGROUND_RESULT = re.compile(r"PID: (\d+)\nStarted background process \1\nOutput: (\S+)")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LiveServer]]:
    """PROCESSES servers on ports of their own, one database."""
    first = make_server(tmp_path_factory.mktemp("scale"))
    started = [first]
    try:
        first.start()
        for number in range(1, PROCESSES):
            replica = make_replica(first, tmp_path_factory.mktemp(f"scale-{number}"))
            started.append(replica)
            replica.start()
        yield started
    finally:
        for server in started:
            if server.process is not None:
                server.stop()


async def test_concurrent_calls_through_several_processes_keep_one_intact_chain(servers: list[LiveServer]) -> None:
    marker = uuid.uuid4().hex
    tokens = [servers[0].create_token(f"scale-{number}") for number in range(CLIENTS_PER_PROCESS)]
    failures: list[str] = []

    async def calls(server: LiveServer, token: str, client_no: int) -> None:
        async with mcp_client(server.mcp_url, token) as client:
            for call_no in range(CALLS_PER_CLIENT):
                result = await client.call_tool(
                    "terminal_exec", {"command": f"echo {marker}-{server.port}-{client_no}-{call_no}"}
                )
                if result.is_error:
                    failures.append(text_of(result))

    async with anyio.create_task_group() as group:
        for server in servers:
            for client_no, token in enumerate(tokens):
                group.start_soon(calls, server, token, client_no)
    assert failures == []

    database = servers[0].database
    started = database.query(
        "SELECT call_id, instance_id FROM audit_auditrecord WHERE kind = 'call.started' AND CAST(arguments AS TEXT) LIKE %s",
        f"%{marker}%",
    )
    calls_made = PROCESSES * CLIENTS_PER_PROCESS * CALLS_PER_CLIENT
    assert len(started) == calls_made
    assert len({row["instance_id"] for row in started}) == PROCESSES, "each process wrote its own calls"
    finished = database.query(
        "SELECT f.outcome FROM audit_auditrecord f JOIN audit_auditrecord s ON f.started_id = s.id "
        "WHERE s.kind = 'call.started' AND CAST(s.arguments AS TEXT) LIKE %s",
        f"%{marker}%",
    )
    assert [row["outcome"] for row in finished] == ["ok"] * calls_made

    chain = database.query("SELECT id, prev_mac, mac FROM audit_auditrecord ORDER BY id")
    assert all(current["prev_mac"] == previous["mac"] for previous, current in itertools.pairwise(chain))
    assert len({row["prev_mac"] for row in chain}) == len(chain), "no two records chain from one mac"
    [head] = database.query("SELECT mac, last_record_id FROM audit_chainhead")
    assert (head["last_record_id"], head["mac"]) == (chain[-1]["id"], chain[-1]["mac"])
    verified = servers[-1].manage("audit_verify")
    assert f"OK: {len(chain)} records checked, chain intact" in verified.stdout


async def test_a_background_process_started_through_one_process_is_stopped_through_another(
    servers: list[LiveServer],
) -> None:
    marker = uuid.uuid4().hex
    async with mcp_client(servers[0].mcp_url, servers[0].token) as first:
        started = await first.call_tool("terminal_exec_background", {"command": f"sleep 300; echo {marker}"})
    found = BACKGROUND_RESULT.fullmatch(text_of(started))
    assert not started.is_error and found is not None, text_of(started)
    pid = int(found[1])
    try:
        async with mcp_client(servers[1].mcp_url, servers[1].token) as second:
            killed = await second.call_tool("terminal_kill", {"pid": pid})
        assert (text_of(killed), killed.is_error) == (f"Sent SIGTERM to {pid}", False)
        await apoll(lambda: not live_pids_with(marker), DEADLINE, "the background process to end")
    finally:
        for leftover in live_pids_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(leftover, signal.SIGKILL)


async def test_a_token_revoked_on_the_shell_has_its_calls_cancelled_in_every_process(servers: list[LiveServer]) -> None:
    name = f"revoked-{uuid.uuid4().hex[:8]}"
    token = servers[0].create_token(name)
    marker = uuid.uuid4().hex
    results: dict[int, Any] = {}

    async def long_call(server: LiveServer) -> None:
        async with mcp_client(server.mcp_url, token) as client:
            results[server.port] = await client.call_tool(
                "terminal_exec", {"command": f"sleep 300; echo {marker}", "timeout": 290}
            )

    async with anyio.create_task_group() as group:
        for server in servers:
            group.start_soon(long_call, server)
        await apoll(lambda: len(live_pids_with(marker)) >= PROCESSES, DEADLINE, "a long call in every process")
        with anyio.fail_after(DEADLINE):
            await anyio.to_thread.run_sync(lambda: servers[-1].manage("revoke_token", name))
    assert sorted(results) == sorted(server.port for server in servers)
    assert all(result.is_error and "cancelled" in text_of(result) for result in results.values()), results
    for server in servers:
        answer = httpx2.post(
            server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)}, timeout=10
        )
        assert answer.status_code == 401


def test_a_stateful_session_lives_in_the_process_that_opened_it(servers: list[LiveServer]) -> None:
    """Why a load balancer must route `Mcp-Session-Id` to one process (README: several processes behind Caddy)."""
    headers = {**MCP_HEADERS, **auth_headers(servers[0].token), "Mcp-Protocol-Version": "2025-11-25"}
    opened = httpx2.post(servers[0].mcp_url, json=INITIALIZE, headers=headers, timeout=10)
    assert opened.status_code == 200
    headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert httpx2.post(servers[0].mcp_url, json=listing, headers=headers, timeout=10).status_code == 200
    assert httpx2.post(servers[1].mcp_url, json=listing, headers=headers, timeout=10).status_code == 404


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next server in turn, as a load balancer without stickiness would."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = itertools.cycle(ports)
        self.used: list[int] = []
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self.ports)
        self.used.append(port)
        request.url = request.url.copy_with(port=port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_self_contained_requests_can_go_to_any_process(servers: list[LiveServer]) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    transport = RoundRobin([server.port for server in servers])
    http = httpx2.AsyncClient(transport=transport, headers=auth_headers(servers[0].token), timeout=60)
    async with http, Client(streamable_http_client(servers[0].mcp_url, http_client=http), mode="2026-07-28") as client:
        for number in range(2 * PROCESSES):
            result = await client.call_tool("terminal_exec", {"command": f"echo call-{number}"})
            assert not result.is_error and f"call-{number}" in text_of(result)
    assert set(transport.used) == {server.port for server in servers}


@contextlib.contextmanager
def caddy_in_front(servers: list[LiveServer], root: Path, policy: str) -> Iterator[str]:
    """Debian's Caddy load-balancing `servers` with `lb_policy <policy>`; yields its URL."""
    port = free_port()
    upstreams = " ".join(f"127.0.0.1:{server.port}" for server in servers)
    config = root / "Caddyfile"
    config.write_text(
        f"{{\n\tadmin off\n\tauto_https off\n}}\nhttp://127.0.0.1:{port} {{\n"
        f"\treverse_proxy {upstreams} {{\n\t\tlb_policy {policy}\n\t}}\n}}\n"
    )
    caddy = subprocess.Popen(
        ["caddy", "run", "--config", str(config), "--adapter", "caddyfile"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert caddy.poll() is None, "caddy exited"
            with contextlib.suppress(httpx2.TransportError):
                return httpx2.get(f"{url}/health", timeout=2).status_code == 200
            return False

        poll(up, DEADLINE, what="Caddy")
        yield url
    finally:
        caddy.terminate()
        caddy.wait(10)


def sessions_lost(url: str, tokens: list[str]) -> int:
    """Open one session per token through `url` and use it three times; how many sessions got lost on the way."""
    lost = 0
    for token in tokens:
        headers = {**MCP_HEADERS, **auth_headers(token), "Mcp-Protocol-Version": "2025-11-25"}
        opened = httpx2.post(f"{url}/mcp", json=INITIALIZE, headers=headers, timeout=10)
        headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        listing = [{"jsonrpc": "2.0", "id": number, "method": "tools/list"} for number in range(3)]
        lost += any(
            httpx2.post(f"{url}/mcp", json=body, headers=headers, timeout=10).status_code != 200 for body in listing
        )
    return lost


def test_caddy_hashing_the_authorization_header_keeps_every_session_in_its_process(
    servers: list[LiveServer], tmp_path: Path
) -> None:
    """The README's advice. Hashing Mcp-Session-Id instead does not work: the initialize request that opens a
    session has none, so it lands on any process, and later requests are hashed to another about as often."""
    tokens = [servers[0].create_token(f"caddy-{number}") for number in range(12)]
    with caddy_in_front(servers, tmp_path, "header Authorization") as url:
        assert sessions_lost(url, tokens) == 0
    with caddy_in_front(servers, tmp_path, "header Mcp-Session-Id") as url:
        assert sessions_lost(url, tokens) > 0
