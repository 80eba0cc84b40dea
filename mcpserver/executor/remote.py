"""The server's side of the executor socket: the Executor interface over connections to the executor.

A connection carries one call at a time and is kept for the next one. Cancelling a call closes its connection, and
the executor ends what the call was running. If the executor dies mid-call, the call fails with `ExecutorLost`
(recorded as interrupted), and the command it had started is ended as soon as an executor answers again.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import select
import signal
import socket
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcpserver.executor import confinement, credential_groups, wire
from mcpserver.executor.interface import (
    OPERATIONS,
    Executor,
    ExecutorError,
    OutputEvent,
    OutputListener,
    ToolFailure,
)

logger = logging.getLogger(__name__)

ORPHAN_KILL_DEADLINE = 120.0  # how long to keep trying to end a command whose executor died under it
MAX_IDLE_CONNECTIONS = 16
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ExecutorUnavailable(ToolFailure):
    """No executor answers on the socket: the call was not run."""


class ExecutorLost(ExecutorError):
    """The executor went away during a call: whether the work was done is unknown (the call was interrupted)."""


class ExecutorFault(ExecutorError):
    """The executor answered with an internal error (a bug or a broken host, not the agent's doing)."""


# Makes sure an executor is listening before a connection is tried: the development child restarts a dead one, and
# after a lost call lets a dying one finish dying first, so the next call is not handed to it.
Starter = Callable[[], Awaitable[None]]
# Told the moment a call loses its connection; it waits for nothing, so the call fails at once (the next one waits).
LossListener = Callable[[], None]
# A connected socket to the executor made without a socket file (the development child's channel); never blocks.
Dialer = Callable[[], socket.socket]


def _forwarder(op: str) -> Callable[..., Awaitable[Any]]:
    """Executor.`op` as a call over the socket: its arguments by name; a listener, if it takes one, gets the output."""
    declared = getattr(Executor, op)
    signature = inspect.signature(declared)
    parameters = list(signature.parameters.values())[1:]  # after `self`
    names = tuple(parameter.name for parameter in parameters)
    required = frozenset(parameter.name for parameter in parameters if parameter.default is parameter.empty)
    defaults = {
        parameter.name: parameter.default for parameter in parameters if parameter.default is not parameter.empty
    }
    allowed = frozenset(names)
    takes_listener = "listener" in names

    async def forward(self: RemoteExecutor, *args: Any, **kwargs: Any) -> Any:
        # Bound by hand, as strictly as Signature.bind, which is slow for a path every call takes.
        arguments = dict(zip(names, args, strict=False))  # the rest may come by keyword
        arguments.update(kwargs)
        given = arguments.keys()
        if len(args) > len(names) or len(given) < len(args) + len(kwargs) or not required <= given <= allowed:
            signature.bind(self, *args, **kwargs)  # raises the TypeError a wrong call of the method raises
        for name, default in defaults.items():
            arguments.setdefault(name, default)
        if not takes_listener:
            return await self.call(op, **arguments)
        listener = arguments.pop("listener")
        return await self.call(op, listener, **arguments, stream=listener is not None)

    return functools.update_wrapper(forward, declared)


def _forwarding(cls: type[Executor]) -> type[Executor]:
    """Give `cls` every operation of the interface as a forwarder: none is written out, none can be left out."""
    for op in OPERATIONS:
        setattr(cls, op, _forwarder(op))
    return cls


@_forwarding
class RemoteExecutor(Executor):
    """The Executor's operations as calls to the executor process; each method is made by `_forwarder`."""

    def __init__(
        self,
        socket_path: str,
        root: str,
        ensure_running: Starter | None = None,
        on_lost: LossListener | None = None,
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
        """An idle connection to reuse (no connect, no peer check), or a new one."""
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
            request = {"op": op, "args": args, "confinement": confinement.PROFILE.get()}
            writer.write(wire.encode({**request, "principal": credential_groups.PRINCIPAL.get()}))
            while True:
                try:
                    frame = await wire.read_frame(reader)
                except (ConnectionError, wire.FrameError) as error:
                    raise ExecutorLost(str(error)) from error
                if frame is None:
                    raise ExecutorLost("the executor closed the connection before answering")
                if "events" in frame:
                    if listener is not None:
                        await listener(output_events(frame["events"]))
                elif "output" in frame:  # an executor from before output events (an upgrade under way)
                    if listener is not None and isinstance(frame["output"], str):
                        await listener([(0.0, "o", frame["output"])])
                elif "spawned" in frame:
                    spawned = frame["spawned"]
                else:
                    answered = "refused" not in frame
                    return self._final(op, frame)
        except ExecutorLost:
            self._drop_idle()
            if self._on_lost is not None:
                self._on_lost()
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
            logger.info(
                "ended process group %d left by a lost executor: %s", pid, "killed" if ended else "already gone"
            )
            return
        logger.warning("could not end process group %d left by a lost executor", pid)

    async def identity(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self.call("ping"))


def output_events(value: object) -> list[OutputEvent]:
    """The output events of a frame, as far as they have the shape relay.py gives them (others are dropped)."""
    if not isinstance(value, list):
        return []
    return [
        (float(event[0]), event[1], event[2])
        for event in value
        if isinstance(event, list)
        and len(event) == 3
        and isinstance(event[0], (int, float))
        and event[1] in ("o", "e", "m")
        and isinstance(event[2], str)
    ]


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
