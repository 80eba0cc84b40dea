"""`python -m mcpserver.executor`: run the executor process (see service.py). Imports no Django."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import signal
import sys
from pathlib import Path

from mcpserver.executor.local import LocalExecutor
from mcpserver.executor.service import ExecutorService, bind_socket, logger
from sandstorm_site.jsonlog import JsonFormatter  # plain logging, no Django


def uid_of(value: str) -> int:
    """A uid given as a number or a user name."""
    if value.isdigit():
        return int(value)
    try:
        return pwd.getpwnam(value).pw_uid
    except KeyError as error:
        raise argparse.ArgumentTypeError(f"no such user: {value}") from error


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcpserver.executor", description="Sandstorm's tool executor.")
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to listen on")
    parser.add_argument("--workspace", required=True, help="the workspace root tools are confined to")
    parser.add_argument("--allow-uid", type=uid_of, required=True, help="the server's uid or user name (the only peer)")
    parser.add_argument(
        "--env-allow",
        default=os.environ.get("SANDSTORM_TOOL_ENV_ALLOW", ""),
        help="comma-separated variables tool processes may inherit (default: $SANDSTORM_TOOL_ENV_ALLOW)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=os.environ.get("SANDSTORM_LOG_FORMAT", "json").strip().lower() or "json",
        help="log lines as JSON objects (as the server does) or text (default: $SANDSTORM_LOG_FORMAT, else json)",
    )
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (a child of the server)")
    return parser.parse_args(argv)


async def serve(options: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    allow = [name.strip() for name in options.env_allow.split(",") if name.strip()]
    service = ExecutorService(LocalExecutor(options.workspace, allow), options.allow_uid)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if options.watch_stdin:
        loop.add_reader(sys.stdin.fileno(), lambda: os.read(sys.stdin.fileno(), 4096) or stop.set())
    server = await asyncio.start_unix_server(service.handle, sock=bind_socket(options.socket))
    identity = service.identity()
    logger.info(
        "executor ready on %s as %s (uid %d), workspace %s, serving uid %d",
        options.socket, identity["user"], identity["uid"], identity["root"], options.allow_uid,
    )  # fmt: skip
    try:
        await stop.wait()
    finally:
        server.close()
        await service.cancel_all()
        options.socket.unlink(missing_ok=True)
        logger.info("executor stopped")


def configure_logging(log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def main(argv: list[str] | None = None) -> None:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(options.log_format)
    asyncio.run(serve(options))


if __name__ == "__main__":
    main()
