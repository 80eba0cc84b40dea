"""The Caddy site for real: Caddy (Debian's) in front of a real server on a Unix socket, as in production.

The site is rendered for plain HTTP on a loopback port (automatic HTTPS needs a public name); everything else is the
production site: the socket upstream, streaming, the body limit, headers and the JSON access log. Behind the server,
as in production, the tool executor runs as a service of its own, socket-activated on the socket the server is
given (SANDSTORM_EXECUTOR_SOCKET), here as the same OS user as the server (two users need root; the production
layout's own tests cover them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psutil
import pytest

from tests.live import REPO, LiveServer, free_port, make_server, mcp_client, poll, text_of
from tests.test_deploy_files import caddy_env, need, rendered_caddyfile

pytestmark = [pytest.mark.live]
SITE_LIMIT = 65536  # smaller than the app's own limit, so a 413 below the app's limit can only come from Caddy


@contextlib.contextmanager
def executor_on_socket(root: Path, workspace: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The executor as its units run it: socket activation (systemd-socket-activate makes and holds the listening
    socket, the executor takes it as fd 3 at the first connection), its own environment (none of the server's)."""
    socket = root / "run-executor" / "executor.sock"
    socket.parent.mkdir(parents=True)
    log_path = root / "executor.log"
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
    argv = [need("systemd-socket-activate"), "--listen", str(socket), *(f"--setenv={name}" for name in env)]
    argv += [sys.executable, "-m", "mcpserver.executor", "--workspace", str(workspace), "--allow-uid", str(os.getuid())]
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        poll(lambda: socket.exists() or process.poll() is not None, 30, what="the executor's socket")
        assert process.poll() is None, log_path.read_text()
        yield process, socket
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def server_on_socket(root: Path, public_url: str) -> Iterator[tuple[LiveServer, Path]]:
    root.mkdir(parents=True, exist_ok=True)
    with executor_on_socket(root, root / "workspace") as (_, executor_socket):
        server = make_server(root, SANDSTORM_PUBLIC_URL=public_url, SANDSTORM_EXECUTOR_SOCKET=str(executor_socket))
        with daphne_on_socket(server, root / "run" / "worker-1.sock") as socket:
            yield server, socket


@contextlib.contextmanager
def daphne_on_socket(server: LiveServer, socket: Path) -> Iterator[Path]:
    """`manage.py serve` on a Unix socket of its own (production: the worker's socket unit holds it)."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    server.manage("bootstrap")
    with server.log_path.open("ab") as log:
        process = server.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--unix-socket", str(socket)],
            cwd=REPO,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        poll(lambda: socket.exists() or process.poll() is not None, 30, what="the server's socket")
        assert process.poll() is None, server.log()
        yield socket
    finally:
        server.stop()


@contextlib.contextmanager
def caddy_in_front(tmp_path: Path, run_dir: Path, port: int, workers: int = 1) -> Iterator[Path]:
    """Debian's Caddy serving the installer's site (deploy/Caddyfile) for the workers' sockets in `run_dir`."""
    site = rendered_caddyfile(
        tmp_path, site=f"http://127.0.0.1:{port}", max_bytes=str(SITE_LIMIT), run_dir=str(run_dir), workers=workers
    )
    main = tmp_path / "main.Caddyfile"
    main.write_text(f"{{\n\tadmin off\n\tgrace_period 5s\n}}\nimport {site}\n")
    log_path = tmp_path / "caddy.log"
    caddy = shutil.which("caddy")
    assert caddy, "caddy is not installed (.ci/run installs it)"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [caddy, "run", "--adapter", "caddyfile", "--config", str(main)],
            env=caddy_env(tmp_path),
            stdout=log,
            stderr=log,
        )
    try:
        poll(lambda: _answers(port) or process.poll() is not None, 30, what="Caddy")
        assert process.poll() is None, log_path.read_text()
        yield log_path
    finally:
        process.terminate()
        try:
            process.wait(15)  # grace_period: connections a failed test left open are closed after it
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(port: int) -> bool:
    try:
        return httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx2.TransportError:
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str, Path]]:
    root = tmp_path_factory.mktemp("caddy")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        server_on_socket(root / "server", url) as (server, socket),
        caddy_in_front(root, socket.parent, port) as caddy_log,
    ):
        yield server, url, caddy_log


def test_health_through_caddy_has_the_security_headers_and_no_server_banner(
    stack: tuple[LiveServer, str, Path],
) -> None:
    _, url, _ = stack
    response = httpx2.get(f"{url}/health")
    assert response.status_code == 200
    # The executor the server found on SANDSTORM_EXECUTOR_SOCKET, not a child of its own.
    assert response.json()["executor"]["ok"] is True and response.json()["executor"]["mode"] == "service"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["strict-transport-security"].startswith("max-age=")
    assert "server" not in response.headers


def test_mcp_without_a_token_gets_the_401_challenge_through_caddy(stack: tuple[LiveServer, str, Path]) -> None:
    _, url, _ = stack
    response = httpx2.post(f"{url}/mcp", json={})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")


@pytest.mark.anyio
async def test_an_mcp_session_works_through_caddy(stack: tuple[LiveServer, str, Path], anyio_backend: str) -> None:
    server, url, _ = stack
    # The legacy handshake needs Mcp-Session-Id to pass both ways.
    async with mcp_client(f"{url}/mcp", server.token) as client:
        result = await client.call_tool("terminal_exec", {"command": "echo through-caddy; echo $PPID > executor-child"})
    assert "through-caddy" in text_of(result)
    # Run by the executor on SANDSTORM_EXECUTOR_SOCKET, the one started above, not by a child of the server's own.
    parent = psutil.Process(int((server.workspace / "executor-child").read_text()))
    assert "mcpserver.executor" in parent.cmdline()
    assert server.process is not None and parent.pid not in {
        child.pid for child in psutil.Process(server.process.pid).children(recursive=True)
    }


def test_caddy_refuses_a_body_over_the_limit(stack: tuple[LiveServer, str, Path]) -> None:
    server, url, _ = stack
    response = httpx2.post(
        f"{url}/mcp", content=b"x" * (SITE_LIMIT + 1), headers={"Authorization": f"Bearer {server.token}"}
    )
    assert response.status_code == 413


def test_a_forged_x_forwarded_for_is_replaced_by_caddy(stack: tuple[LiveServer, str, Path]) -> None:
    server, url, _ = stack
    assert httpx2.get(f"{url}/health?probe=forwarded", headers={"X-Forwarded-For": "203.0.113.9"}).status_code == 200

    def access_line() -> dict[str, object] | None:
        for line in server.log().splitlines():
            if (
                line.startswith("{")
                and json.loads(line).get("logger") == "sandstorm.access"
                and json.loads(line).get("path") == "/health"
            ):
                return json.loads(line)
        return None

    line = poll(access_line, 10, what="the server's access log line")
    assert line["client"] == "127.0.0.1"
    assert "203.0.113.9" not in server.log()


def test_caddys_access_log_is_json_without_query_strings_or_tokens(stack: tuple[LiveServer, str, Path]) -> None:
    server, url, caddy_log = stack
    httpx2.get(f"{url}/health?access_token=query-secret-123", headers={"Authorization": f"Bearer {server.token}"})

    def logged() -> list[dict[str, Any]]:  # Caddy's JSON log entries
        lines = [json.loads(line) for line in caddy_log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if str(line.get("logger", "")).startswith("http.log.access")]

    entries = poll(lambda: [e for e in logged() if e["request"]["uri"] == "/health"], 10, what="Caddy's access log")
    assert entries
    text = caddy_log.read_text()
    assert "query-secret-123" not in text and server.token not in text
    assert all("Authorization" not in entry["request"]["headers"] for entry in logged())
