"""`make run` (`manage.py run`): the port first, then bootstrap, then Daphne; the banner once /health answers, and
a taken port in one line naming SANDSTORM_MCP_PORT."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from oauth.claude_code import claude_code_line
from tests.database import ON_POSTGRES
from tests.live import (
    INITIALIZE,
    MCP_HEADERS,
    REPO,
    START_DEADLINE,
    LiveServer,
    auth_headers,
    make_server,
    make_server_without_state,
)
from tests.oauth_flow import AdminSession

pytestmark = [pytest.mark.live]
READY = "Sandstorm is ready."


class Output:
    """The lines a process writes to its (merged) stdout, read as they come."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self.process, self.fd, self.buffer, self.lines = process, process.stdout.fileno(), b"", list[str]()

    def until(self, wanted: str, deadline: float = START_DEADLINE) -> str:
        """Read until a line containing `wanted` arrives (returned at once, before anything else is read)."""
        end = time.monotonic() + deadline
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                self.lines.append(line.decode(errors="replace"))
                if wanted in self.lines[-1]:
                    return self.lines[-1]
            left = end - time.monotonic()
            assert left > 0, f"no line with {wanted!r} within {deadline}s:\n" + "\n".join(self.lines)
            readable, _, _ = select.select([self.fd], [], [], left)
            if readable:
                chunk = os.read(self.fd, 65536)
                assert chunk, f"the output ended before a line with {wanted!r}:\n" + "\n".join(self.lines)
                self.buffer += chunk

    def rest(self) -> list[str]:
        """Every line, once the process has ended."""
        assert self.process.stdout is not None
        self.buffer += self.process.stdout.read()
        self.lines += self.buffer.decode(errors="replace").splitlines()
        self.buffer = b""
        return self.lines


def start_run(server: LiveServer) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "run"], cwd=REPO, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def test_make_run_is_manage_py_run() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^run: venv\n((?:\t.*\n)+)", makefile, flags=re.MULTILINE)
    assert recipe is not None and recipe[1] == "\t$(PY) manage.py run\n"


def test_the_banner_comes_once_and_only_when_health_answers(tmp_path: Path) -> None:
    server = make_server(tmp_path, SANDSTORM_MCP_TOKEN="", SANDSTORM_ADMIN_PASSWORD="")
    process = start_run(server)
    output = Output(process)
    try:
        output.until(READY, 2 * START_DEADLINE)  # a first run migrates before it starts
        # At once, before anything else: the banner's appearance means the server answers now.
        assert httpx2.get(f"{server.url}/health", timeout=5).status_code == 200
        password = output.until("Password:").split()[1]
        token = output.until("Token:").split()[1]
        assert "(named 'first-run')" in output.lines[-1]
        assert output.until("claude mcp").strip() == claude_code_line(server.mcp_url, token)
        initialize = httpx2.post(
            server.mcp_url, json=INITIALIZE, headers={**MCP_HEADERS, **auth_headers(token)}, timeout=10
        )
        assert initialize.status_code == 200
        AdminSession(server, "admin", password).close()  # the printed password signs in (it asserts so)
    finally:
        returncode = stop(process)
    lines = output.rest()
    assert returncode == 0, "\n".join(lines)
    assert sum(READY in line for line in lines) == 1 and sum(token in line for line in lines) == 2, "\n".join(lines)
    assert "Traceback" not in "\n".join(lines)


def test_a_second_run_prints_the_banner_without_secrets_and_the_password_hint_that_works(tmp_path: Path) -> None:
    server = make_server(tmp_path, SANDSTORM_MCP_TOKEN="", SANDSTORM_ADMIN_PASSWORD="")
    server.manage("bootstrap")
    process = start_run(server)
    output = Output(process)
    try:
        output.until(READY)
        assert httpx2.get(f"{server.url}/health", timeout=5).status_code == 200
        hint = output.until("Password:")
        assert "(reset it: .venv/bin/python manage.py changepassword admin)" in hint
        assert "shown once" not in output.until("Token:")
    finally:
        stop(process)


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_taken_port_is_one_line_naming_the_variable(tmp_path: Path, command: str) -> None:
    server = make_server_without_state(tmp_path)
    with socket.socket() as taken:
        # Beside the socket that holds the port for this test (tests/live.py free_port), as another server would.
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        result = server.manage(command, check=False)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode != 0
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf"(CommandError: )?Port {server.port} on 127\.0\.0\.1 is in use: set SANDSTORM_MCP_PORT=\d+ "
        r"\(or stop the other server\)\.",
        lines[0],
    ), lines[0]
    suggested = int(re.findall(r"SANDSTORM_MCP_PORT=(\d+)", lines[0])[0])
    assert suggested != server.port
    if command == "run" and not ON_POSTGRES:
        assert not (server.state_dir / "sandstorm.sqlite3").exists(), "the port is checked before migrating"
