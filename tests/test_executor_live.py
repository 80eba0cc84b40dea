"""The executor behind a real server (development mode: the server's child): liveness, interrupted calls,
background processes that outlive the server, what /health says, and what a killed server leaves behind."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import psutil
import pytest

from tests.live import (
    LiveServer,
    apoll,
    command_the_server_tracks,
    live_pids_with,
    make_server,
    mcp_client,
    poll,
    running_server,
    shut_sockets_of,
    still_running,
    text_of,
)

pytestmark = [pytest.mark.live, pytest.mark.anyio]
# How soon a call's error reaches the client once its executor is lost: nothing is waited for (about 10 ms).
LOST_REPORTED_WITHIN = 0.5


def executor_pid(server: LiveServer) -> int:
    assert server.process is not None
    children = psutil.Process(server.process.pid).children()
    found = [child.pid for child in children if "mcpserver.executor" in " ".join(child.cmdline())]
    assert len(found) == 1, found
    return found[0]


# An agent's command that looks for a way into the executor: every Unix socket that its ancestors up to the
# executor and the server hold and that has an address, and every socket it inherited itself.
# Each one it can connect to gets a ping; it prints what answered like an executor.
PROBE = r"""
import json, os, socket, struct

def ping(connection):
    body = json.dumps({"op": "ping", "args": {}}).encode()
    connection.settimeout(3)
    connection.sendall(struct.pack(">I", len(body)) + body)
    answer = connection.recv(65536)
    return b'"ok"' in answer and b'"pid"' in answer

addresses = {}
for line in open("/proc/net/unix").read().splitlines()[1:]:
    fields = line.split()
    if len(fields) >= 8:
        addresses[fields[6]] = fields[7]
def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

# Up to the executor and the server that started it, no further: nothing above them is ours to poke.
ancestors, pid = [], os.getppid()
while pid > 1:
    ancestors.append(pid)
    if b"mcpserver.executor" in open(f"/proc/{pid}/cmdline", "rb").read():
        ancestors.append(parent(pid))  # the server
        break
    pid = parent(pid)
else:
    ancestors = []  # not under an executor: look at nothing
targets = set()
for ancestor in ancestors:
    for fd in os.listdir(f"/proc/{ancestor}/fd"):
        try:
            link = os.readlink(f"/proc/{ancestor}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            address = addresses.get(link[8:-1])
            if address:
                targets.add("\0" + address[1:] if address.startswith("@") else address)
reached, tried = [], len(targets)
for address in sorted(targets):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(address)
            if ping(connection):
                reached.append(address)
    except OSError:
        pass
for fd in os.listdir("/proc/self/fd"):
    try:
        inherited = socket.socket(fileno=os.dup(int(fd)))
    except OSError:
        continue
    tried += 1
    try:
        if ping(inherited):
            reached.append(f"fd {fd}")
    except OSError:
        pass
    finally:
        inherited.close()
print(json.dumps({"ancestors": ancestors, "tried": tried, "reached": reached}))
"""


async def test_an_agents_command_finds_no_way_to_talk_to_the_development_executor(live_server: LiveServer) -> None:
    (live_server.workspace / "probe.py").write_text(PROBE)
    # Profile `host`: the socket design must hold unconfined (`workspace` may not even run the server's Python).
    host = live_server.manage("create_token", "probe-host", "--confinement", "host").stdout.split()[-1]
    async with mcp_client(live_server.mcp_url, host) as client:
        result = await client.call_tool("terminal_exec", {"command": f"{sys.executable} probe.py"})
    text = text_of(result)
    assert not result.is_error, text
    found = json.loads(text.split("stdout:\n", 1)[1].split("\n", 1)[0])
    assert executor_pid(live_server) in found["ancestors"], found  # it did look at the executor's descriptors
    assert found["reached"] == [], found


def call_records(server: LiveServer, marker: str) -> list[dict[str, object]]:
    sql = "SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s"
    started = server.database.query(sql, f"%{marker}%")
    assert len(started) == 1, started
    return server.database.query("SELECT * FROM audit_auditrecord WHERE call_id=%s ORDER BY id", started[0]["call_id"])


async def test_health_names_the_executor_and_its_user(live_server: LiveServer) -> None:
    body = httpx2.get(f"{live_server.url}/health").json()
    assert body["ok"] is True
    assert body["executor"]["ok"] is True and body["executor"]["mode"] == "child"
    assert body["executor"]["user"] == psutil.Process().username()


@pytest.fixture(scope="module")
def server_that_loses_executors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("loses-executors")) as server:
        yield server


def drop_its_connections(server: LiveServer, pid: int) -> None:
    """The executor closes its connections to the server and lives on (as it does with a frame it cannot read)."""
    assert server.process is not None
    assert shut_sockets_of(pid, server.process.pid) >= 1  # the call's connection, at least


# Ways to lose the executor under a call: what is done to its pid, and whether it lives on after.
WAYS_TO_LOSE_IT: dict[str, tuple[Callable[[LiveServer, int], object], bool]] = {
    "killed": (lambda server, pid: os.kill(pid, signal.SIGKILL), False),
    "terminated": (lambda server, pid: os.kill(pid, signal.SIGTERM), False),
    "connection dropped": (drop_its_connections, True),
}


@pytest.mark.parametrize("way", WAYS_TO_LOSE_IT)
async def test_a_call_whose_executor_is_lost_fails_at_once_is_recorded_interrupted_and_the_next_call_works(
    server_that_loses_executors: LiveServer, way: str
) -> None:
    server = server_that_loses_executors
    lose, lives_on = WAYS_TO_LOSE_IT[way]
    marker = f"lost-{uuid.uuid4().hex}"
    async with mcp_client(server.mcp_url, server.token) as client:
        async with command_the_server_tracks(client, marker) as results:
            first = executor_pid(server)
            lost_at = time.monotonic()
            lose(server, first)
        # The block ends when the call's result has reached the client.
        assert time.monotonic() - lost_at < LOST_REPORTED_WITHIN
        result = results[0]
        assert result.is_error is True
        assert "tool executor stopped during this call" in text_of(result)
        rows = call_records(server, marker)
        assert [row["kind"] for row in rows] == ["call.started", "call.finished"]
        assert rows[1]["outcome"] == "interrupted"
        # The next call works: on a new executor, or on the same one if it lives on.
        again = await client.call_tool("terminal_exec", {"command": "echo back"})
        assert text_of(again) == "stdout:\nback\n\nexit_code: 0"
        assert (executor_pid(server) == first) is lives_on
        # The command the lost call had running was ended.
        await apoll(lambda: not live_pids_with(marker), 15, "the orphaned command to end")
    assert server.manage("audit_verify").returncode == 0


async def test_health_restarts_a_dead_development_executor(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.start()
    try:
        first = executor_pid(server)
        psutil.Process(first).kill()
        poll(
            lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE,
            10,
            what="exit",
        )
        assert httpx2.get(f"{server.url}/health", timeout=30).json()["executor"]["ok"] is True
        assert executor_pid(server) != first
    finally:
        server.stop()


async def test_a_server_killed_with_sigkill_leaves_nothing_in_the_temp_directory_and_starts_again(
    tmp_path: Path,
) -> None:
    # The development executor has no socket file (child.py); before 0.2.0 its socket's directory came from mkdtemp,
    # and a killed server left it behind. The executor and its tools get the same TMPDIR here.
    temp = tmp_path / "tmp"
    temp.mkdir()
    server = make_server(tmp_path / "server", TMPDIR=str(temp), SANDSTORM_TOOL_ENV_ALLOW="TMPDIR")
    server.start()
    try:
        async with mcp_client(server.mcp_url, server.token) as client:
            assert not (await client.call_tool("terminal_exec", {"command": "true"})).is_error
        executor = executor_pid(server)
        server.stop(signal.SIGKILL)
        poll(lambda: not still_running(executor), 10, what="its executor to exit with it")
        assert list(temp.iterdir()) == []
        server.start()
        assert httpx2.get(f"{server.url}/health", timeout=30).json()["executor"]["ok"] is True
    finally:
        server.stop()


async def test_a_background_process_survives_a_server_restart_and_can_still_be_killed(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.start()
    marker = f"bg-{uuid.uuid4().hex}"
    try:
        async with mcp_client(server.mcp_url, server.token) as client:
            started = text_of(await client.call_tool("terminal_exec_background", {"command": f"sleep 300; : {marker}"}))
        pid = int(started.split("PID: ")[1].split()[0])
        server.stop(signal.SIGTERM)
        assert live_pids_with(marker), "the background process died with the server"
        server.start()
        async with mcp_client(server.mcp_url, server.token) as client:
            killed = await client.call_tool("terminal_kill", {"pid": pid})
        assert killed.is_error is False, text_of(killed)
        await apoll(lambda: not live_pids_with(marker), 15, "the background process to end")
    finally:
        server.stop()
        for pid in live_pids_with(marker):
            psutil.Process(pid).kill()
