"""A real Sandstorm server for tests: Daphne in a subprocess on a free port, with its own state dir and workspace."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import psutil
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from tests import tiers
from tests.boot_template import BOOTSTRAP_INPUTS, REPO, boot_template
from tests.database import ON_POSTGRES, ServerDatabase, new_postgres_database

# Generous: on a loaded 2-core machine a start has taken over 30 s; a healthy server ends the wait at once.
START_DEADLINE = 60.0
T = TypeVar("T")
# A raw 2025-11-25 initialize request, for tests that speak HTTP to /mcp without the SDK client.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


# The sockets that hold the ports free_port handed out, until this process ends.
_HOLDERS: list[socket.socket] = []


def free_port() -> int:
    """A port on 127.0.0.1 that stays this caller's while this process runs, so that no other test process (an xdist
    worker) and no outgoing connection can take it between now and the moment its server binds it.

    The port is picked by binding port 0 plainly, which the kernel never answers with a port some socket is bound to,
    and is then held by that socket, bound and not listening, with SO_REUSEADDR set: a server that also sets it
    (Daphne through mcpserver/listening.py, Caddy, redis-server) binds the port beside it and listens, while a plain
    bind, another free_port and the kernel's choice of a local port for a connection are all refused the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _HOLDERS.append(sock)
    return int(sock.getsockname()[1])


def poll(check: Callable[[], T | None], deadline: float, interval: float = 0.05, what: str = "condition") -> T:
    """Call `check` until it returns something truthy or `deadline` seconds pass (then fail)."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        time.sleep(interval)


@dataclass
class LiveServer:
    root: Path
    port: int
    env: dict[str, str]
    token: str
    admin_password: str
    process: subprocess.Popen[bytes] | None = None
    # Its state is a copy of the bootstrapped template (tests/boot_template.py), not yet started: a `bootstrap`
    # would change nothing, so the first start skips it (later starts run it, as on any server).
    fresh_copy: bool = False
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.root / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    @property
    def workspace(self) -> Path:
        return Path(self.env["SANDSTORM_WORKSPACE_ROOT"])

    @property
    def state_dir(self) -> Path:
        return Path(self.env["SANDSTORM_STATE_DIR"])

    @property
    def database(self) -> ServerDatabase:
        """The server's database (its SQLite file, or its own PostgreSQL database), for tests to read and tamper with."""
        return ServerDatabase(self.env)

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120
        )
        if check and result.returncode:
            raise AssertionError(f"manage.py {' '.join(args)} exited with {result.returncode}:\n{result.stderr}")
        return result

    def create_token(self, name: str, scope: str = "mcp") -> str:
        return self.manage("create_token", name, "--scope", scope).stdout.strip().splitlines()[-1]

    def start(self) -> None:
        if not self.fresh_copy:
            self.manage("bootstrap")
        self.fresh_copy = False
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve"], cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            poll(self.healthy, START_DEADLINE, what="the server's /health")
        except AssertionError:
            self.stop()  # not left running (with its executor) for the rest of the session
            raise

    def healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log()}")
        try:
            return httpx2.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx2.TransportError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def make_server(root: Path, **overrides: str) -> LiveServer:
    """A server in `root` (not started), on a port of its own, with these environment variables. Its state is a copy
    of a bootstrapped one (tests/boot_template.py) unless `overrides` change what bootstrap makes."""
    return _make_server(root, overrides, new_state=False)


def make_server_without_state(root: Path, **overrides: str) -> LiveServer:
    """`make_server`, but with no state at all, as a first `make run` finds."""
    return _make_server(root, overrides, new_state=True)


def _make_server(root: Path, overrides: dict[str, str], new_state: bool) -> LiveServer:
    tiers.require("live", "makes a live server")
    root.mkdir(parents=True, exist_ok=True)
    (root / "workspace").mkdir(exist_ok=True)
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SANDSTORM_", "DJANGO_")) and key != "DATABASE_URL"
    }
    env.update(SANDSTORM_MCP_HOST="127.0.0.1", SANDSTORM_MCP_PORT=str(port), PYTHONUNBUFFERED="1")
    state_dir = root / "state"
    from_template = not new_state and not BOOTSTRAP_INPUTS & overrides.keys() and not state_dir.exists()
    if from_template:
        # A copy of the state a bootstrap makes: its database (under PostgreSQL one of its own, made from the
        # template database; tests/conftest.py drops it after the test that made it, or at the end of the session
        # for servers shared by many tests), keys, token and password.
        template = boot_template(env)
        env.update(template.copy_to(state_dir))
        token, password = template.token, template.admin_password
    else:
        token, password = "sst_test_" + secrets.token_urlsafe(24), secrets.token_urlsafe(12)
        if ON_POSTGRES and "DATABASE_URL" not in overrides:
            env["DATABASE_URL"] = new_postgres_database()  # a database of its own, as the state dir is its own
    env.update(
        SANDSTORM_STATE_DIR=str(state_dir),
        SANDSTORM_WORKSPACE_ROOT=str(root / "workspace"),
        SANDSTORM_MCP_TOKEN=token,
        SANDSTORM_ADMIN_PASSWORD=password,
    )
    env.update(overrides)
    return LiveServer(root=root, port=port, env=env, token=token, admin_password=password, fresh_copy=from_template)


def make_replica(server: LiveServer, root: Path) -> LiveServer:
    """One more server process for `server`'s data, on a port of its own, as the processes behind one Caddy would
    be: the same state dir (keys, SQLite file), workspace, database, bootstrap token and admin password."""
    shared = {
        "SANDSTORM_STATE_DIR": str(server.state_dir),
        "SANDSTORM_WORKSPACE_ROOT": str(server.workspace),
        "SANDSTORM_MCP_TOKEN": server.token,
        "SANDSTORM_ADMIN_PASSWORD": server.admin_password,
    }
    if "DATABASE_URL" in server.env:
        shared["DATABASE_URL"] = server.env["DATABASE_URL"]
    replica = make_server(root, **shared)
    replica.token, replica.admin_password = server.token, server.admin_password
    return replica


@contextlib.contextmanager
def running_server(root: Path, **overrides: str) -> Iterator[LiveServer]:
    server = make_server(root, **overrides)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def mcp_client(
    url: str, token: str, *, mode: str = "legacy", headers: dict[str, str] | None = None, **options: Any
) -> AsyncIterator[Client]:
    """The official SDK client over streamable HTTP; `mode` "legacy" (handshake + session) or "2026-07-28";
    `options` for the Client (an elicitation_callback, ...)."""
    http = httpx2.AsyncClient(headers={**auth_headers(token), **(headers or {})}, timeout=httpx2.Timeout(60, read=330))
    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, **options) as client:
            yield client


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def apoll(check: Callable[[], T | None], deadline: float, what: str) -> T:
    """`poll` for async tests: waits without blocking the event loop the client runs on."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def command_the_server_tracks(client: Client, marker: str) -> AsyncIterator[list[CallToolResult]]:
    """Run `sleep 60; : marker` through `terminal_exec` and yield once the server knows its pid; the call's result
    is in the yielded list after the block (the block is expected to end the call, e.g. by killing the executor).

    The command prints a line first and the call asks for progress: the executor sends a command's spawn notice
    before its first output, so once that output has reached the client the server has read the notice."""
    results: list[CallToolResult] = []
    printed = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        printed.set()

    async def run() -> None:
        command = f"echo running; sleep 60; : {marker}"
        results.append(await client.call_tool("terminal_exec", {"command": command}, progress_callback=on_progress))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        with anyio.fail_after(30):
            await printed.wait()
        yield results


def live_pids_with(marker: str) -> list[int]:
    """Processes (not zombies) whose command line mentions `marker`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(marker in part for part in proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def still_running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie waiting to be reaped has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_group_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that still run (a zombie waiting for its new parent to reap it has ended)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


SYS_PIDFD_GETFD = 438  # the same number on every architecture (Linux 5.6, after the syscall tables were unified)
_libc = ctypes.CDLL(None, use_errno=True)
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def shut_sockets_of(pid: int, peer: int, types: frozenset[int] = frozenset({socket.SOCK_STREAM})) -> int:
    """Shut down, both ways, the sockets of these `types` that process `pid` holds towards process `peer` (which made
    or connected their other end: SO_PEERCRED), as if `pid` had closed them while it lives on. Each is reached through
    a copy of its descriptor (pidfd_getfd), so `peer` reads end-of-file and so does `pid`; its other sockets (its
    event loop's own wake-up pair) are left alone. Needs ptrace rights over `pid` (root in CI). Returns how many."""
    pidfd = os.pidfd_open(pid)
    shut = 0
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:["):
                    continue
            except FileNotFoundError:  # closed meanwhile
                continue
            fd = _libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                raise OSError(ctypes.get_errno(), f"pidfd_getfd of fd {name} of process {pid}")
            with socket.socket(fileno=fd) as copy:
                made_by, _uid, _gid = PEERCRED.unpack(
                    copy.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
                )
                if copy.type in types and made_by == peer:
                    copy.shutdown(socket.SHUT_RDWR)
                    shut += 1
    finally:
        os.close(pidfd)
    return shut


# What an mcp:read credential is offered: the upstream readers and the toolkit's (searching changes nothing).
READ_ONLY_TOOLS = frozenset(
    {
        "file_read",
        "file_list",
        "git_status",
        "git_diff",
        "git_log",
        "workspace_info",
        "git_branch",
        "file_grep",
        "file_glob",
        "terminal_output",
        "terminal_list",
    }
)


def tool_count() -> int:
    """How many tools the server lists to a full-scope credential: the 20 upstream ones and the toolkit's."""
    from mcpserver.registry import TOOLS
    from mcpserver.tools import ALL_TOOL_MODULES

    assert ALL_TOOL_MODULES  # imported for its effect: every tool module registered in TOOLS
    return len(TOOLS)
