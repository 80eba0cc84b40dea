"""The executor process: the tools' OS work, done as the agent user, for the one server uid it was told to serve.

It holds no database connection, no Django settings and no secrets; it knows the workspace, the environment tool
processes get, and which uid may connect. Every connection is checked with SO_PEERCRED before a byte is read, so a
process the agent started (running as the agent user, like this one) cannot ask it for anything. The development
child shares the agent's uid with the server, so there the check cannot tell them apart: it has no socket file at
all, only connections the server hands it (handover.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcpserver.executor import confinement, credential_groups, wire
from mcpserver.executor.interface import OPERATIONS, OutputEvent, ToolFailure
from mcpserver.executor.local import LocalExecutor

logger = logging.getLogger("sandstorm.executor")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SPAWN_NOTICE_DELAY = 0.05  # seconds a command runs before the server is told its pid
REFUSAL_LINGER = 2.0  # seconds a refused peer has to read why before the connection is closed


def peer_uid(connection: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket, as the kernel recorded it at connect time."""
    _pid, uid, _gid = _PEERCRED.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid


def refusal_for(uid: int, allowed_uid: int) -> str | None:
    """Why a peer with `uid` is refused, or None if it is the server."""
    if uid == allowed_uid:
        return None
    return f"connection refused: peer uid {uid} is not the server's uid {allowed_uid}"


class ExecutorService:
    def __init__(self, executor: LocalExecutor, allowed_uid: int) -> None:
        self.executor = executor
        self.allowed_uid = allowed_uid
        self._connections: set[asyncio.Task[None]] = set()
        self._stopping = False

    def identity(self) -> dict[str, Any]:
        account = pwd.getpwuid(os.getuid())
        try:
            disk_free: int | None = shutil.disk_usage(self.executor.root).free
        except OSError:
            disk_free = None
        return {
            "pid": os.getpid(),
            "uid": os.getuid(),
            "user": account.pw_name,
            "root": self.executor.root,
            "home": account.pw_dir,
            "disk_free": disk_free,
            # With where revocation finds the processes a credential left running (credential_groups.py).
            "confinement": {**confinement.active().describe(), "process_groups": credential_groups.active().describe()},
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            connection = writer.get_extra_info("socket")
            refused = refusal_for(peer_uid(connection), self.allowed_uid)
            if refused is not None:
                logger.warning("%s", refused)
                writer.write(wire.encode({"refused": refused}))
                await self._linger(reader, writer)
                return
            await self._serve(reader, writer)
        except (ConnectionError, wire.FrameError) as error:
            logger.warning("dropped a connection: %s", error)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            # Shut-down (cancel_all): ending here is the plan, not an error for asyncio to log.
        finally:
            self._connections.discard(task)
            writer.close()

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Let the refusal arrive: closing with the peer's request unread would reset the connection first."""
        await writer.drain()
        writer.write_eof()
        try:
            async with asyncio.timeout(REFUSAL_LINGER):
                while await reader.read(65536):
                    pass
        except TimeoutError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One call at a time on this connection, until the server closes it (which cancels a call in flight)."""
        early = b""  # bytes of the next request read while watching for a hang-up
        while True:
            request = await wire.read_frame(reader, early)
            if request is None:
                return
            call = asyncio.ensure_future(self._answer(request, writer))
            hang_up = asyncio.ensure_future(reader.read(1))  # b"" when the server closes the connection
            try:
                await asyncio.wait({call, hang_up}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not call.done():  # the server hung up, or the executor is stopping: cancel the call
                    call.cancel()  # a running command's process group is ended by its own cancellation handling
                hang_up.cancel()
                await asyncio.gather(call, hang_up, return_exceptions=True)
            if call.cancelled() or call.exception() is not None:
                return
            if hang_up.cancelled():
                early = b""
            elif hang_up.exception() is not None:
                return
            else:
                early = hang_up.result()
                if not early:
                    return  # the server closed the connection after the answer
            await writer.drain()

    async def _answer(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        answer = await self._result(request, writer)
        try:
            frame = wire.encode(answer)
        except wire.FrameError as error:
            frame = wire.encode({"error": str(error)})
        writer.write(frame)

    async def _result(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> dict[str, Any]:
        op, args = request.get("op"), request.get("args")
        if op == "ping":
            return {"ok": self.identity()}
        if op not in OPERATIONS or not isinstance(args, dict):  # nothing else of the executor object is reachable
            return {"error": f"unknown request {op!r}"}
        try:
            confinement.PROFILE.set(confinement.profile_for(op, request.get("confinement")))
        except ValueError as error:
            return {"error": str(error)}
        principal = request.get("principal", "")
        if not isinstance(principal, str):
            return {"error": f"bad principal {principal!r}"}
        credential_groups.PRINCIPAL.set(principal)
        method: Callable[..., Awaitable[object]] = getattr(self.executor, op)
        notices: list[asyncio.TimerHandle] = []
        if op == "run_command":
            stream = bool(args.pop("stream", False))
            args.update(self._run_listeners(writer, stream, notices))
        try:
            return {"ok": wire.to_wire(await method(**args))}
        except ToolFailure as failure:
            return {"fail": str(failure)}
        except TypeError as error:  # arguments that do not fit the operation: a server bug, not the agent's
            logger.exception("bad arguments for %s", op)
            return {"error": f"bad arguments for {op}: {error}"}
        except Exception as error:  # the process boundary: any fault becomes an answer, never a silent hang-up
            logger.exception("%s failed", op)
            return {"error": f"{op} failed in the executor: {type(error).__name__}: {error}"}
        finally:
            for notice in notices:
                notice.cancel()  # the call is over: a notice not sent yet is not needed

    @staticmethod
    def _run_listeners(
        writer: asyncio.StreamWriter, stream: bool, notices: list[asyncio.TimerHandle]
    ) -> dict[str, Any]:
        unsent: list[bytes] = []  # the spawn notice, until it is sent

        def send_notice() -> None:
            if unsent:
                writer.write(unsent.pop())

        async def listener(events: list[OutputEvent]) -> None:
            send_notice()  # before any output: a server that has seen output knows the command's pid
            writer.write(wire.encode({"events": events}))
            await writer.drain()

        def on_spawn(pid: int, start_ticks: int) -> None:
            # Sent only if the command is still running a moment later (or has output before then): most commands
            # end sooner, and a frame less is a wake-up less for the server (the notice matters only if we die
            # while it runs).
            unsent.append(wire.encode({"spawned": {"pid": pid, "start_ticks": start_ticks}}))
            notices.append(asyncio.get_running_loop().call_later(SPAWN_NOTICE_DELAY, send_notice))

        return {"listener": listener if stream else None, "on_spawn": on_spawn}

    async def cancel_all(self) -> None:
        """Shut-down: cancel the calls in flight, which ends the commands they run (not background processes)."""
        self._stopping = True
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)


def bind_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, replacing a stale one. Anyone may connect: SO_PEERCRED decides."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o666)
    listener.listen(128)
    return listener
