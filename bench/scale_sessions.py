"""Section 8, figure 2: open sessions held by many credentials: the server's memory, and a new client's connect
beside them (bench/scale.py says how)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import sections
from bench.client import PROTOCOL_VERSION, Connection, HttpError
from bench.scale_sizes import ONE_SERVER, ScaleSizes
from bench.server import SERVER_SETTINGS, BenchServer, log, start_server
from bench.stats import summary
from tests.live import INITIALIZE, MCP_HEADERS, LiveServer

# The credentials all belong to the admin, so the per-user cap must take every session; and a session that makes no
# request beyond the handshake is closed after SANDSTORM_SESSION_UNUSED_TIMEOUT (60 s by default): on a slow machine
# the first ones would be gone before the memory is read and the last checked.
SESSION_SETTINGS = {
    **SERVER_SETTINGS,
    "SANDSTORM_MAX_SESSIONS_PER_USER": "5000",
    "SANDSTORM_SESSION_UNUSED_TIMEOUT": "1800",
}
OPENERS = 10  # credentials opening their sessions at once: quicker than one by one, not a stampede
INITIALIZE_BODY = json.dumps(INITIALIZE).encode()
INITIALIZED_BODY = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
PING_BODY = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode()


@dataclass
class HeldSession:
    """An MCP session left open: its connection (shared by its credential's sessions) and its request headers."""

    connection: Connection
    headers: dict[str, str]


async def handshake(connection: Connection, token: str) -> tuple[HeldSession, float]:
    """`initialize` (timed: on a new connection, the connect is in it too) and `notifications/initialized`; the
    session, never closed, and initialize's round trip in seconds."""
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
    began = time.perf_counter()
    opened = await connection.request("POST", "/mcp", headers, INITIALIZE_BODY)
    took = time.perf_counter() - began
    session_id = opened.headers.get("mcp-session-id", "")
    if opened.status != 200 or not session_id:
        raise HttpError(f"http_{opened.status}", "initialize")
    headers |= {"Mcp-Session-Id": session_id, "Mcp-Protocol-Version": PROTOCOL_VERSION}
    notified = await connection.request("POST", "/mcp", headers, INITIALIZED_BODY)
    if notified.status != 202:
        raise HttpError(f"http_{notified.status}", "notifications/initialized")
    return HeldSession(connection, headers), took


def sessions_figure(scale: ScaleSizes, base: Path, root: Path) -> dict[str, Any]:
    server = start_server(root, base, SESSION_SETTINGS)
    try:
        tokens = new_tokens(server, "held", scale.credentials)
        found = asyncio.run(held_sessions(server, tokens, scale))
    finally:
        server.stop()
    log(
        f"bench: scale: {found['opened']} open sessions: RSS +{found['rss_growth_kb']} KB, "
        f"{found['kb_per_session']} KB a session; a new client's connect {found['connect']['median_ms']} ms"
    )
    return found


def new_tokens(server: BenchServer, prefix: str, count: int) -> list[str]:
    """`count` new bearer tokens of the admin, made in one process (`create_token` would start Python once each)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.dbtask", "tokens", prefix, str(count)],
        cwd=server.tree, env=server.env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return [str(token) for token in json.loads(done.stdout)]


async def held_sessions(server: BenchServer, tokens: list[str], scale: ScaleSizes) -> dict[str, Any]:
    assert server.process is not None
    pid = server.process.pid
    await open_sessions(server, tokens[:OPENERS], 1)  # the first sessions import and cache what later ones reuse
    before = rss_kb(pid)
    began = time.perf_counter()
    held, errors = await open_sessions(server, tokens, scale.sessions_per_credential)
    opening_s = time.perf_counter() - began
    await asyncio.sleep(1)  # what the last handshakes set going (their tasks, their log lines) has run
    after = rss_kb(pid)
    connects = await timed_connects(server, tokens, scale.connects)
    alive = await still_open(held)
    growth = after - before if after is not None and before is not None else None
    return {
        "credentials": len(tokens),
        "sessions_per_credential": scale.sessions_per_credential,
        "opened": len(held),
        "open_errors": dict(errors),
        "opening_s": round(opening_s, 2),
        "rss_before_kb": before,
        "rss_after_kb": after,
        "rss_growth_kb": growth,
        "kb_per_session": round(growth / len(held), 1) if growth is not None and held else None,
        "connect": summary(connects),
        "still_open": alive,
        "server": ONE_SERVER,
    }


def rss_kb(pid: int) -> int | None:
    """The process's resident memory (VmRSS), in KiB; None where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def open_sessions(server: LiveServer, tokens: list[str], each: int) -> tuple[list[HeldSession], Counter[str]]:
    """`each` sessions for every token, opened over one keep-alive connection per token, which is closed after:
    the sessions live on in the server, as those of clients that went quiet."""
    limit = asyncio.Semaphore(OPENERS)
    errors: Counter[str] = Counter()

    async def open_for(token: str) -> list[HeldSession]:
        connection = sections.connection(server)
        opened: list[HeldSession] = []
        async with limit:
            try:
                for _ in range(each):
                    opened.append((await handshake(connection, token))[0])
            except (HttpError, OSError, asyncio.IncompleteReadError) as error:
                errors[getattr(error, "kind", type(error).__name__)] += 1
            finally:
                await connection.close()
        return opened

    groups = await asyncio.gather(*(open_for(token) for token in tokens))
    return [session for group in groups for session in group], errors


async def timed_connects(server: LiveServer, tokens: list[str], count: int) -> list[float]:
    """`count` new clients, one after another, each on a new connection with one of the credentials: the round trip
    of `initialize`, connect included. Their sessions stay open too."""
    durations = []
    for number in range(count):
        connection = sections.connection(server)
        try:
            durations.append((await handshake(connection, tokens[number % len(tokens)]))[1])
        finally:
            await connection.close()
        await asyncio.sleep(sections.SETTLE)
    return durations


async def still_open(held: list[HeldSession]) -> int:
    """How many of the sessions still answer a ping (an ended one is a 404): none was closed by a cap or a timeout
    while measured."""
    by_connection: dict[int, list[HeldSession]] = {}
    for session in held:
        by_connection.setdefault(id(session.connection), []).append(session)
    limit = asyncio.Semaphore(OPENERS)

    async def ping_all(sessions: list[HeldSession]) -> int:
        answered = 0
        async with limit:
            try:
                for session in sessions:
                    response = await session.connection.request("POST", "/mcp", session.headers, PING_BODY)
                    answered += response.status == 200
            finally:
                await sessions[0].connection.close()
        return answered

    return sum(await asyncio.gather(*(ping_all(group) for group in by_connection.values())))
