"""The executor process and its socket, without a server: the peer check, the protocol, cancellation, liveness.

Each test talks to a real `python -m mcpserver.executor` process through the server's own client (RemoteExecutor).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpserver.executor import child as child_module
from mcpserver.executor import wire
from mcpserver.executor.child import ExecutorChild
from mcpserver.executor.interface import (
    OPERATIONS,
    ExecResult,
    Executor,
    ExecutorError,
    OutputEvent,
    OutputListener,
    ToolFailure,
)
from mcpserver.executor.local import LocalExecutor
from mcpserver.executor.remote import Connection, ExecutorFault, ExecutorLost, ExecutorUnavailable, RemoteExecutor
from mcpserver.executor.service import refusal_for
from tests.live import REPO, live_pids_with, poll, shut_sockets_of, still_running

pytestmark = [pytest.mark.anyio]
NOBODY = 65534


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client uses asyncio streams, as under Daphne


@pytest.fixture
def child(tmp_path: Path) -> Iterator[ExecutorChild]:
    (tmp_path / "ws").mkdir()
    executor = ExecutorChild(str(tmp_path / "ws"))
    executor.start()
    yield executor
    executor.stop()


def remote(child: ExecutorChild) -> RemoteExecutor:
    return child.remote()


def start_executor(workspace: Path, allow_uid: int) -> tuple[subprocess.Popen[bytes], str]:
    """An executor serving `allow_uid`, its socket in a directory any user may enter (the peer check guards it)."""
    directory = tempfile.mkdtemp(prefix="sst-exec-test-")
    os.chmod(directory, 0o755)
    path = f"{directory}/executor.sock"
    argv = [sys.executable, "-m", "mcpserver.executor", "--socket", path, "--workspace", str(workspace)]
    process = subprocess.Popen([*argv, "--allow-uid", str(allow_uid), "--log-format", "text"], cwd=REPO)
    poll(lambda: os.path.exists(path), 20, what="the executor's socket")
    return process, path


def test_the_peer_check_accepts_only_the_servers_uid() -> None:
    # Faked input: the uid the kernel reports (see the tests below for real peers of other uids).
    assert refusal_for(1000, 1000) is None
    refused = refusal_for(1001, 1000)
    assert refused is not None and "1001" in refused and "1000" in refused


async def test_a_peer_whose_uid_is_not_the_servers_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # A real peer: this process, whose uid is not the one the executor was told to serve.
    process, path = start_executor(tmp_path, allow_uid=os.getuid() + 4242)
    try:
        executor = RemoteExecutor(path, str(tmp_path))
        with pytest.raises(ExecutorUnavailable, match=f"refused.*peer uid {os.getuid()}"):
            await executor.write_file("planted.txt", "x")
        assert not (tmp_path / "planted.txt").exists()
    finally:
        process.terminate()
        process.wait(10)


def _ping_as(uid: int, path: str) -> bytes:
    """Connect as `uid` from a forked child (root drops to it) and return the executor's answer, as JSON."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls until _exit
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(10)
                connection.connect(path)
                connection.sendall(wire.encode({"op": "ping", "args": {}}))
                frame = wire.recv_frame(connection)
            os.write(write_end, json.dumps(frame).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        answer = reader.read()
    os.waitpid(pid, 0)
    return answer


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as a second uid needs root to setuid (CI runs as root)")
def test_a_connection_from_another_real_uid_is_refused(tmp_path: Path) -> None:
    # A real second uid: a child of this test drops to `nobody` and connects, as an agent's process would.
    process, path = start_executor(tmp_path, allow_uid=0)
    try:
        refused = json.loads(_ping_as(NOBODY, path))
        assert refused == {"refused": f"connection refused: peer uid {NOBODY} is not the server's uid 0"}
        accepted = json.loads(_ping_as(0, path))
        assert accepted["ok"]["uid"] == 0
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="needs systemd's systemd-socket-activate")
async def test_the_executor_takes_its_socket_from_systemd(tmp_path: Path) -> None:
    # Socket activation as production uses it: the socket file is systemd's, made before the executor starts.
    path = f"{tempfile.mkdtemp(prefix='sst-exec-test-')}/executor.sock"
    argv = ["systemd-socket-activate", "-l", path, sys.executable, "-m", "mcpserver.executor"]
    process = subprocess.Popen([*argv, "--workspace", str(tmp_path), "--allow-uid", str(os.getuid())], cwd=REPO)
    try:
        poll(lambda: os.path.exists(path), 20, what="the socket")
        executor = RemoteExecutor(path, str(tmp_path))
        assert (await executor.identity())["pid"] == process.pid  # the first connection started it
        result = await executor.run_command("env", None, 30, 65536, None)
        assert "LISTEN_" not in result.stdout  # systemd's variables are the executor's, not the tools'
    finally:
        process.terminate()
        process.wait(10)
    assert os.path.exists(path)  # systemd's socket, left for the next start


async def test_a_command_streams_its_output_and_returns_its_result(child: ExecutorChild) -> None:
    pieces: list[list[OutputEvent]] = []

    async def listener(events: list[OutputEvent]) -> None:
        pieces.append(events)

    command = "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2; exit 3"
    result = await remote(child).run_command(command, None, 30, 65536, listener)
    assert isinstance(result, ExecResult)
    assert (result.stdout, result.stderr, result.exit_code, result.timed_out) == (
        "line1\nline2\nline3\n",
        "oops\n",
        3,
        False,
    )
    printed = [(code, text) for events in pieces for _at, code, text in events]
    assert printed == [("o", "line1\n"), ("o", "line2\n"), ("o", "line3\n"), ("e", "oops\n")]
    assert len(pieces) >= 2  # it arrived as it was printed, not at the end


async def test_a_tool_failure_reaches_the_server_with_its_message(child: ExecutorChild) -> None:
    with pytest.raises(ToolFailure, match="^Error: .*missing.txt"):
        await remote(child).read_file("missing.txt", None, None, 1000)
    with pytest.raises(ToolFailure, match="outside the allowed directory"):
        await remote(child).read_file("../../etc/passwd", None, None, 1000)


async def test_an_unknown_operation_or_bad_arguments_is_a_fault_not_a_hang(child: ExecutorChild) -> None:
    with pytest.raises(ExecutorFault, match="unknown request"):
        await remote(child).call("__init__")
    with pytest.raises(ExecutorFault, match="bad arguments"):
        await remote(child).call("read_file", nonsense=1)


async def test_nothing_of_the_executor_but_the_interfaces_operations_can_be_called(
    child: ExecutorChild, tmp_path: Path
) -> None:
    served = LocalExecutor(str(tmp_path))  # what the executor process serves: its helpers, attributes, dunders
    others = (set(dir(served)) | set(vars(served))) - OPERATIONS
    assert {"_write_file", "_listable", "_parent_dir", "workspace", "env", "__class__"} <= others
    executor = remote(child)
    for name in sorted(others):
        with pytest.raises(ExecutorFault, match="unknown request"):
            await executor.call(name)


def test_every_operation_of_the_interface_is_implemented_on_both_sides() -> None:
    assert {"read_file", "run_command", "git_log", "prune_output"} <= OPERATIONS
    assert "identity" not in OPERATIONS and "call" not in OPERATIONS
    for op in OPERATIONS:
        assert getattr(LocalExecutor, op) is not getattr(Executor, op), op
        assert getattr(RemoteExecutor, op) is not getattr(Executor, op), op


async def test_the_client_sends_an_operations_arguments_by_name_and_its_listener_apart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sent: list[tuple[str, OutputListener | None, dict[str, object]]] = []

    async def call(op: str, listener: OutputListener | None = None, **args: object) -> object:
        sent.append((op, listener, args))
        return True

    async def listener(events: list[OutputEvent]) -> None:
        pass

    executor = RemoteExecutor(str(tmp_path / "unused.sock"), str(tmp_path))
    monkeypatch.setattr(executor, "call", call)
    await executor.run_command("true", None, timeout=5, output_budget=100, listener=listener)
    await executor.signal_group(1, 1, 7, signal.SIGTERM)
    await executor.prune_output()
    assert sent == [
        (
            "run_command",
            listener,
            {
                "command": "true",
                "cwd": None,
                "timeout": 5,
                "output_budget": 100,
                "listen_max_bytes": 16 * 1024 * 1024,
                "stream": True,
            },
        ),
        ("signal_group", None, {"pid": 1, "pgid": 1, "start_ticks": 7, "signum": signal.SIGTERM}),
        ("prune_output", None, {"max_bytes": None}),
    ]
    with pytest.raises(TypeError):
        await executor.move("only the source")  # type: ignore[call-arg]  # a missing argument fails here, unsent
    assert len(sent) == 3


def test_every_failure_of_an_executor_call_is_an_executor_error() -> None:
    for failure in (ToolFailure, ExecutorUnavailable, ExecutorLost, ExecutorFault):
        assert issubclass(failure, ExecutorError)
    # dispatch.py tells them apart: a lost or faulty executor is not the agent's failure
    assert not issubclass(ExecutorLost, ToolFailure) and not issubclass(ExecutorFault, ToolFailure)


async def test_cancelling_a_call_ends_the_command_it_runs(child: ExecutorChild) -> None:
    marker = f"cancel-{uuid.uuid4().hex}"
    call = asyncio.ensure_future(remote(child).run_command(f"sleep 60; : {marker}", None, 120, 65536, None))
    await asyncio.to_thread(poll, lambda: live_pids_with(marker), 15, what="the command")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.to_thread(poll, lambda: not live_pids_with(marker), 10, what="the command to be ended")


def notice_of_spawn(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once the client has read an executor's "spawned" frame (it then knows the command's pid)."""
    noticed = asyncio.Event()
    read_frame = wire.read_frame

    async def reading(reader: asyncio.StreamReader, early: bytes = b"") -> dict[str, Any] | None:
        frame = await read_frame(reader, early)
        if frame is not None and "spawned" in frame:
            noticed.set()
        return frame

    monkeypatch.setattr(wire, "read_frame", reading)
    return noticed


async def test_a_commands_spawn_notice_comes_before_its_first_output(
    child: ExecutorChild, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames: list[str] = []
    read_frame = wire.read_frame

    async def reading(reader: asyncio.StreamReader, early: bytes = b"") -> dict[str, Any] | None:
        frame = await read_frame(reader, early)
        if frame is not None:
            frames.append(next(iter(frame)))
        return frame

    async def listener(events: list[OutputEvent]) -> None:
        pass

    monkeypatch.setattr(wire, "read_frame", reading)
    # Output at once, long before the notice's delay: the notice is sent first all the same.
    result = await remote(child).run_command("echo at once; sleep 0.5", None, 30, 65536, listener)
    assert result.stdout == "at once\n"
    assert frames[:2] == ["spawned", "events"], frames


async def test_an_executor_killed_mid_call_interrupts_the_call_and_the_next_call_works(
    child: ExecutorChild, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = remote(child)
    marker = f"lost-{uuid.uuid4().hex}"
    first_pid = child.pid
    spawned = notice_of_spawn(monkeypatch)
    call = asyncio.ensure_future(executor.run_command(f"sleep 60; : {marker}", None, 120, 65536, None))
    await asyncio.wait_for(spawned.wait(), 15)  # the client knows the command's pid, to end it if the executor dies
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    with pytest.raises(ExecutorLost):
        await call
    result = await executor.run_command("echo back", None, 30, 65536, None)
    assert result.stdout == "back\n"
    assert child.restarts == 1 and child.pid != first_pid
    # The command the dead executor left behind is ended by the new one.
    await asyncio.to_thread(poll, lambda: not live_pids_with(marker), 15, what="the orphaned command to be ended")


async def a_call_lost_under(
    child: ExecutorChild, monkeypatch: pytest.MonkeyPatch, marker: str, lose: Callable[[int], None]
) -> float:
    """Start a long command, lose the executor under it with `lose(pid)`; how long the call then took to fail."""
    spawned = notice_of_spawn(monkeypatch)
    call = asyncio.ensure_future(remote(child).run_command(f"sleep 60; : {marker}", None, 120, 65536, None))
    await asyncio.wait_for(spawned.wait(), 15)
    assert child.pid is not None
    lost_at = time.monotonic()
    lose(child.pid)
    with pytest.raises(ExecutorLost):
        await call
    return time.monotonic() - lost_at


async def test_a_call_whose_connection_a_living_executor_drops_fails_at_once_and_the_executor_serves_on(
    child: ExecutorChild, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_pid, marker = child.pid, f"dropped-{uuid.uuid4().hex}"

    def drop_its_connections(pid: int) -> None:
        assert shut_sockets_of(pid, os.getpid()) >= 1  # the call's connection, at least

    assert await a_call_lost_under(child, monkeypatch, marker, drop_its_connections) < 0.5
    # Nothing is wrong with the executor itself: the next call goes to it, without a restart.
    result = await remote(child).run_command("echo back", None, 30, 65536, None)
    assert result.stdout == "back\n"
    assert child.pid == first_pid and child.restarts == 0
    await asyncio.to_thread(poll, lambda: not live_pids_with(marker), 15, what="the dropped call's command to end")


async def test_an_executor_that_stops_serving_but_does_not_exit_is_replaced_before_the_next_call(
    child: ExecutorChild, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(child_module, "LOST_WAIT", 0.2)
    first_pid, marker = child.pid, f"stuck-{uuid.uuid4().hex}"
    assert first_pid is not None

    def stuck_on_its_way_out(pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)  # it will never finish stopping by itself
        shut_sockets_of(pid, os.getpid(), frozenset({socket.SOCK_STREAM, socket.SOCK_SEQPACKET}))  # its channel too

    try:
        assert await a_call_lost_under(child, monkeypatch, marker, stuck_on_its_way_out) < 0.5
        result = await remote(child).run_command("echo back", None, 30, 65536, None)
        assert result.stdout == "back\n"
        assert child.pid != first_pid and child.restarts == 1
        assert not still_running(first_pid)
        # The command the stuck executor had running is ended by the new one.
        await asyncio.to_thread(poll, lambda: not live_pids_with(marker), 15, what="the orphaned command to be ended")
    finally:
        if still_running(first_pid):
            os.kill(first_pid, signal.SIGKILL)


async def test_a_background_process_outlives_its_executor_and_a_new_one_can_signal_it(child: ExecutorChild) -> None:
    started = await remote(child).start_background("sleep 300", None)
    child.stop()  # SIGTERM: the executor ends calls in flight, never background processes
    assert (await remote(child).process_start_ticks(started.pid)) == started.start_ticks  # a new child answers
    assert await remote(child).signal_group(started.pid, started.pgid, started.start_ticks, signal.SIGKILL)
    await asyncio.to_thread(poll, lambda: started.pid not in live_pids_with("sleep 300"), 10, what="the process to end")


async def test_calls_reuse_one_connection_and_survive_an_executor_restart(
    child: ExecutorChild, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = remote(child)
    opened: list[int] = []
    connect = executor._connect

    async def counting_connect() -> Connection:
        opened.append(1)
        return await connect()

    monkeypatch.setattr(executor, "_connect", counting_connect)
    for _ in range(5):
        assert (await executor.run_command("echo hi", None, 30, 65536, None)).stdout == "hi\n"
    assert len(opened) == 1
    child.stop()  # its connection, idle in our pool, is closed by the executor as it stops
    assert (await executor.run_command("echo again", None, 30, 65536, None)).stdout == "again\n"
    assert len(opened) == 2 and child.restarts == 1


def test_the_executor_gets_none_of_the_servers_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"sst_{uuid.uuid4().hex}"
    for name in ("SANDSTORM_MCP_TOKEN", "SANDSTORM_ADMIN_PASSWORD", "SANDSTORM_SECRET_KEY", "DATABASE_URL"):
        monkeypatch.setenv(name, secret)
    monkeypatch.setenv("ALLOWED_FOR_TOOLS", "visible")
    executor = ExecutorChild(str(tmp_path), env_allow=["ALLOWED_FOR_TOOLS"])
    executor.start()
    try:
        environ = Path(f"/proc/{executor.pid}/environ").read_bytes()
        assert secret.encode() not in environ
        assert b"ALLOWED_FOR_TOOLS=visible" in environ
    finally:
        executor.stop()


def test_a_child_executor_exits_when_its_server_goes_away(child: ExecutorChild) -> None:
    process = child._process
    assert process is not None and process.stdin is not None
    process.stdin.close()  # what the kernel does to the pipe when the server dies, however it dies
    assert process.wait(10) == 0


def test_a_child_executor_exits_when_its_channel_closes(child: ExecutorChild) -> None:
    process = child._process
    assert process is not None and child._channel is not None
    child._channel.close()  # no connection can reach it any more: staying up would be for nothing
    assert process.wait(10) == 0


def test_a_child_executor_has_no_socket_anyone_could_connect_to(child: ExecutorChild) -> None:
    # Not a file, not an abstract name: every Unix socket it holds is one end of a pair, without an address.
    assert child.pid is not None
    held = set()
    for fd in os.listdir(f"/proc/{child.pid}/fd"):
        link = os.readlink(f"/proc/{child.pid}/fd/{fd}")
        if link.startswith("socket:["):
            held.add(link[len("socket:[") : -1])
    assert held, "the channel at least"
    with open("/proc/net/unix") as table:
        named = {fields[6]: fields[7] for fields in (line.split() for line in list(table)[1:]) if len(fields) >= 8}
    assert not held & named.keys(), [named[inode] for inode in held & named.keys()]


async def test_nothing_answers_on_a_missing_socket(tmp_path: Path) -> None:
    executor = RemoteExecutor(str(tmp_path / "none.sock"), str(tmp_path))
    with pytest.raises(ExecutorUnavailable, match="not running"):
        await executor.workspace_info()


@pytest.mark.parametrize("body", [b"[1, 2]", b"not json", b"\xff\xfe"])
def test_a_frame_that_is_not_a_json_object_is_rejected(body: bytes) -> None:
    with pytest.raises(wire.FrameError):
        wire.decode(body)


async def test_a_frame_over_the_size_limit_is_rejected_before_it_is_read() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(wire.HEADER.pack(wire.MAX_FRAME + 1))
    with pytest.raises(wire.FrameError, match="over"):
        await wire.read_frame(reader)


def test_results_keep_their_types_across_the_wire() -> None:
    result = ExecResult("out", "err", 0, False, False, 5, None, 3, 3)
    assert wire.from_wire(wire.decode(wire.encode({"ok": wire.to_wire(result)})[wire.HEADER.size :])["ok"]) == result


def test_the_executor_reads_its_limits_from_its_environment_and_names_a_bad_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mcpserver.executor.__main__ import parse_args

    argv = ["--socket", "/tmp/unused.sock", "--workspace", "/tmp", "--allow-uid", "0"]
    monkeypatch.setenv("SANDSTORM_TOOL_MAX_PROCESSES", "77")
    monkeypatch.setenv("SANDSTORM_OUTPUT_MAX_BYTES", "0")
    options = parse_args(argv)
    assert (options.max_processes, options.output_max_bytes) == (77, 0)
    assert parse_args([*argv, "--max-processes", "5"]).max_processes == 5  # the server's value wins (development)
    monkeypatch.setenv("SANDSTORM_TOOL_MAX_MEMORY", "12")
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "SANDSTORM_TOOL_MAX_MEMORY must be 0 (off) or at least 67108864, not 12" in capsys.readouterr().err


async def test_output_from_an_executor_of_the_version_before_still_reaches_the_listener(tmp_path: Path) -> None:
    """During an upgrade the server may meet the old executor for a moment: its plain output frames still count."""
    path = str(tmp_path / "old.sock")

    async def old_executor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await wire.read_frame(reader)
        writer.write(wire.encode({"output": "from before\n"}))
        done = ExecResult("from before\n", "", 0, False, False, 1, None, 12, 0)
        writer.write(wire.encode({"ok": wire.to_wire(done)}))
        await writer.drain()

    server = await asyncio.start_unix_server(old_executor, path=path)
    received: list[OutputEvent] = []

    async def listener(events: list[OutputEvent]) -> None:
        received.extend(events)

    try:
        result = await RemoteExecutor(path, str(tmp_path)).run_command("echo", None, 5, 1000, listener)
    finally:
        server.close()
    assert result.stdout == "from before\n" and received == [(0.0, "o", "from before\n")]
