"""The server's side of the executor socket: the Executor interface over connections to the executor.

A connection carries one call at a time and is kept for the next one. Cancelling a call closes its connection, and the executor ends what the call was running. If the executor dies
mid-call, the call fails with `ExecutorLost` (recorded as interrupted), and the command it had started is ended as
soon as an executor answers again.
"""

from __future__ import annotations

import asyncio
import logging
import select
import signal
import socket
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcpserver.executor import wire
from mcpserver.executor.interface import BackgroundStart, ExecResult, OutputListener, ToolFailure

logger = logging.getLogger(__name__)

ORPHAN_KILL_DEADLINE = 120.0
MAX_IDLE_CONNECTIONS = 16
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]  # how long to keep trying to end a command whose executor died under it


class ExecutorUnavailable(ToolFailure):
    """No executor answers on the socket: the call was not run."""


class ExecutorLost(Exception):
    """The executor went away during a call: whether the work was done is unknown (the call was interrupted)."""


class ExecutorFault(Exception):
    """The executor answered with an internal error (a bug or a broken host, not the agent's doing)."""


# Makes sure an executor is listening before a connection is tried (the development child restarts it), and
# lets a dying one finish dying after a lost call, so the next call does not connect to its closing socket.
Starter = Callable[[], Awaitable[None]]
# A connected socket to the executor made without a socket file (the development child's channel); never blocks.
Dialer = Callable[[], socket.socket]


class RemoteExecutor:
    def __init__(
        self,
        socket_path: str,
        root: str,
        ensure_running: Starter | None = None,
        on_lost: Starter | None = None,
        dial: Dialer | None = None,
    ) -> None:
        self.socket_path = socket_path  # with `dial`, only what messages call it
        self.dial = dial
        self.root = root
        self._ensure_running = ensure_running
        self._on_lost = on_lost
        self._cleanups: set[asyncio.Task[None]] = set()
        # Open connections between calls, per event loop (a connection belongs to the loop that opened it).
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Connection]] = weakref.WeakKeyDictionary()

    async def _connection(self) -> Connection:
        """An idle connection to reuse (no connect, no peer check: about half of a small call's cost), or a new one."""
        idle = self._idle.get(asyncio.get_running_loop(), [])
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not _closed_by_peer(writer):
                return reader, writer
            writer.close()  # the executor closed it meanwhile (it stopped or restarted)
        return await self._connect()

    def _release(self, connection: Connection) -> None:
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        if len(idle) < MAX_IDLE_CONNECTIONS:
            idle.append(connection)
        else:
            connection[1].close()

    def _drop_idle(self) -> None:
        for _reader, writer in self._idle.pop(asyncio.get_running_loop(), []):
            writer.close()

    async def _connect(self) -> Connection:
        if self._ensure_running is not None:
            try:
                await self._ensure_running()
            except RuntimeError as error:
                raise ExecutorUnavailable(f"Error: the tool executor could not be started: {error}") from error
        try:
            if self.dial is not None:
                return await asyncio.open_unix_connection(sock=self.dial(), limit=1 << 20)
            return await asyncio.open_unix_connection(self.socket_path, limit=1 << 20)
        except (FileNotFoundError, ConnectionRefusedError) as error:
            raise ExecutorUnavailable(
                f"Error: the tool executor is not running (nothing answers on {self.socket_path}); "
                "no tool can run until it is back. The server's /health shows its state."
            ) from error
        except PermissionError as error:  # a socket this server's user may not use: a deployment mistake
            message = f"Error: this server's OS user may not connect to the tool executor's socket {self.socket_path}"
            raise ExecutorUnavailable(message) from error

    async def call(self, op: str, listener: OutputListener | None = None, **args: Any) -> Any:
        reader, writer = await self._connection()
        spawned: dict[str, int] | None = None
        answered = False  # only a connection whose call was answered is reused; any other is closed (cancelling)
        try:
            writer.write(wire.encode({"op": op, "args": args}))
            while True:
                try:
                    frame = await wire.read_frame(reader)
                except (ConnectionError, wire.FrameError) as error:
                    raise ExecutorLost(str(error)) from error
                if frame is None:
                    raise ExecutorLost("the executor closed the connection before answering")
                if "output" in frame:
                    if listener is not None:
                        await listener(str(frame["output"]))
                elif "spawned" in frame:
                    spawned = frame["spawned"]
                else:
                    answered = "refused" not in frame
                    return self._final(op, frame)
        except ExecutorLost:
            self._drop_idle()
            if self._on_lost is not None:
                await self._on_lost()
            if spawned is not None:
                self._end_orphan_later(spawned["pid"], spawned["start_ticks"])
            raise
        finally:
            if answered:
                self._release((reader, writer))
            else:
                writer.close()

    def _final(self, op: str, frame: dict[str, Any]) -> Any:
        if "ok" in frame:
            return wire.from_wire(frame["ok"])
        if "fail" in frame:
            raise ToolFailure(str(frame["fail"]))
        if "refused" in frame:
            raise ExecutorUnavailable(f"Error: the tool executor refused this server: {frame['refused']}")
        raise ExecutorFault(f"{op}: {frame.get('error', 'malformed answer')}")

    def _end_orphan_later(self, pid: int, start_ticks: int) -> None:
        task = asyncio.get_running_loop().create_task(self._end_orphan(pid, start_ticks))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _end_orphan(self, pid: int, start_ticks: int) -> None:
        """Kill the group of a command whose executor died, once an executor answers again (same user)."""
        deadline = asyncio.get_running_loop().time() + ORPHAN_KILL_DEADLINE
        while asyncio.get_running_loop().time() < deadline:
            try:
                ended = await self.signal_group(pid, pid, start_ticks, signal.SIGKILL)
            except (ExecutorUnavailable, ExecutorLost, ExecutorFault):
                await asyncio.sleep(1.0)
                continue
            logger.info("ended process group %d left by a lost executor: %s", pid, "killed" if ended else "already gone")
            return
        logger.warning("could not end process group %d left by a lost executor", pid)

    async def identity(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("ping"))

    # --- files ---------------------------------------------------------------------------------------------------
    async def read_file(self, path: str, offset: int | None, limit: int | None, max_bytes: int) -> str:
        return cast(str, await self.call("read_file", path=path, offset=offset, limit=limit, max_bytes=max_bytes))

    async def write_file(self, path: str, content: str) -> str:
        return cast(str, await self.call("write_file", path=path, content=content))

    async def delete_file(self, path: str) -> str:
        return cast(str, await self.call("delete_file", path=path))

    async def list_dir(self, path: str, recursive: bool) -> str:
        return cast(str, await self.call("list_dir", path=path, recursive=recursive))

    async def move(self, source: str, dest: str) -> str:
        return cast(str, await self.call("move", source=source, dest=dest))

    async def mkdir(self, path: str) -> str:
        return cast(str, await self.call("mkdir", path=path))

    # --- processes -----------------------------------------------------------------------------------------------
    async def run_command(
        self, command: str, cwd: str | None, timeout: float, output_budget: int, listener: OutputListener | None
    ) -> ExecResult:
        return cast(
            ExecResult,
            await self.call(
                "run_command",
                listener,
                command=command,
                cwd=cwd,
                timeout=timeout,
                output_budget=output_budget,
                stream=listener is not None,
            ),
        )

    async def start_background(self, command: str, cwd: str | None) -> BackgroundStart:
        return cast(BackgroundStart, await self.call("start_background", command=command, cwd=cwd))

    async def process_start_ticks(self, pid: int) -> int | None:
        return cast("int | None", await self.call("process_start_ticks", pid=pid))

    async def signal_group(self, pid: int, pgid: int, start_ticks: int, signum: int) -> bool:
        return bool(await self.call("signal_group", pid=pid, pgid=pgid, start_ticks=start_ticks, signum=int(signum)))

    # --- git -----------------------------------------------------------------------------------------------------
    async def git_clone(self, repo_url: str, path: str | None, branch: str | None) -> str:
        return cast(str, await self.call("git_clone", repo_url=repo_url, path=path, branch=branch))

    async def git_status(self, path: str | None) -> str:
        return cast(str, await self.call("git_status", path=path))

    async def git_commit(self, message: str, path: str | None) -> str:
        return cast(str, await self.call("git_commit", message=message, path=path))

    async def git_push(self, remote: str | None, branch: str | None, path: str | None) -> str:
        return cast(str, await self.call("git_push", remote=remote, branch=branch, path=path))

    async def git_pull(self, remote: str | None, branch: str | None, path: str | None) -> str:
        return cast(str, await self.call("git_pull", remote=remote, branch=branch, path=path))

    async def git_branch(self, name: str | None, path: str | None) -> str:
        return cast(str, await self.call("git_branch", name=name, path=path))

    async def git_checkout(self, branch: str, path: str | None) -> str:
        return cast(str, await self.call("git_checkout", branch=branch, path=path))

    async def git_diff(self, path: str | None) -> str:
        return cast(str, await self.call("git_diff", path=path))

    async def git_log(self, n: int, path: str | None) -> str:
        return cast(str, await self.call("git_log", n=n, path=path))

    # --- workspace -----------------------------------------------------------------------------------------------
    async def workspace_info(self) -> str:
        return cast(str, await self.call("workspace_info"))

    async def install(self, packages: list[str], manager: str) -> ExecResult:
        return cast(ExecResult, await self.call("install", packages=packages, manager=manager))

    # --- maintenance (not a tool) --------------------------------------------------------------------------------
    async def prune_output(self, max_bytes: int | None = None) -> str:
        return cast(str, await self.call("prune_output", max_bytes=max_bytes))


def _closed_by_peer(writer: asyncio.StreamWriter) -> bool:
    """Whether an idle connection was closed by the executor (it never sends unasked, so readable means closed).

    Asked of the kernel: the event loop may not have had its turn to notice yet.
    """
    poller = select.poll()
    poller.register(writer.get_extra_info("socket").fileno(), select.POLLIN | select.POLLRDHUP)
    return bool(poller.poll(0))


def ping(executor: RemoteExecutor, timeout: float = 2.0) -> dict[str, Any]:
    """A blocking liveness check for synchronous code (the consent page): the executor's identity, or an OSError."""
    if executor.dial is not None:
        connection = executor.dial()
    else:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with connection:
        connection.settimeout(timeout)
        if executor.dial is None:
            connection.connect(executor.socket_path)
        connection.sendall(wire.encode({"op": "ping", "args": {}}))
        frame = wire.recv_frame(connection)
    if frame is None:
        raise ConnectionError("the executor closed the connection without answering")
    if "ok" not in frame:
        raise ConnectionError(str(frame.get("refused") or frame.get("error") or "malformed answer"))
    return cast(dict[str, Any], frame["ok"])
