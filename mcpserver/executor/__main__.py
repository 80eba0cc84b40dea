"""`python -m mcpserver.executor`: run the executor process (see service.py). Imports no Django."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from mcpserver.executor import confinement, credential_groups, rlimits
from mcpserver.executor.handover import HandedOver
from mcpserver.executor.jsonlog import JsonFormatter  # plain logging, no Django
from mcpserver.executor.local import LocalExecutor
from mcpserver.executor.rlimits import DEFAULT_MAX_PROCESSES, MIN_MAX_MEMORY, ToolLimits, default_max_memory
from mcpserver.executor.savedoutput import DEFAULT_MAX_BYTES, OutputDirInWorkspace
from mcpserver.executor.service import ExecutorService, bind_socket, logger

SD_LISTEN_FDS_START = 3


def uid_of(value: str) -> int:
    """A uid given as a number or a user name."""
    if value.isdigit():
        return int(value)
    try:
        return pwd.getpwnam(value).pw_uid
    except KeyError as error:
        raise argparse.ArgumentTypeError(f"no such user: {value}") from error


def count_of(variable: str, smallest: int = 1) -> Callable[[str], int]:
    """An argparse type: 0 (off) or a whole number of at least `smallest`; the error names the variable."""

    def parse(value: str) -> int:
        try:
            number = int(value.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{variable} must be a whole number, not {value!r}") from None
        if number < 0 or 0 < number < smallest:
            raise argparse.ArgumentTypeError(f"{variable} must be 0 (off) or at least {smallest}, not {number}")
        return number

    return parse


def default_output_dir() -> str:
    """Saved output's place when --output-dir is not given: never the workspace, whose tools every credential has."""
    if os.environ.get("SANDSTORM_OUTPUT_DIR"):
        return os.environ["SANDSTORM_OUTPUT_DIR"]
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]  # systemd's StateDirectory= (the first, if several)
    if state:
        return os.path.join(state, "output")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "sandstorm-mcp", "output")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcpserver.executor", description="Sandstorm's tool executor.")
    parser.add_argument(
        "--socket",
        type=Path,
        help="the Unix socket to listen on (not needed when systemd passes one: socket activation)",
    )
    parser.add_argument("--workspace", required=True, help="the workspace root tools are confined to")
    parser.add_argument("--allow-uid", type=uid_of, required=True, help="the server's uid or user name (the only peer)")
    parser.add_argument(
        "--env-allow",
        default=os.environ.get("SANDSTORM_TOOL_ENV_ALLOW", ""),
        help="comma-separated variables tool processes may inherit (default: $SANDSTORM_TOOL_ENV_ALLOW)",
    )
    parser.add_argument(
        "--max-processes",
        type=count_of("SANDSTORM_TOOL_MAX_PROCESSES"),
        default=os.environ.get("SANDSTORM_TOOL_MAX_PROCESSES", str(DEFAULT_MAX_PROCESSES)),
        help="processes and threads a command may add to the host's (RLIMIT_NPROC); 0: no limit "
        f"(default: $SANDSTORM_TOOL_MAX_PROCESSES, else {DEFAULT_MAX_PROCESSES})",
    )
    parser.add_argument(
        "--max-memory",
        type=count_of("SANDSTORM_TOOL_MAX_MEMORY", MIN_MAX_MEMORY),
        default=os.environ.get("SANDSTORM_TOOL_MAX_MEMORY", str(default_max_memory())),
        help="bytes of private memory per tool process (RLIMIT_DATA); 0: no limit "
        "(default: $SANDSTORM_TOOL_MAX_MEMORY, else half the RAM)",
    )
    parser.add_argument(
        "--output-max-bytes",
        type=count_of("SANDSTORM_OUTPUT_MAX_BYTES"),
        default=os.environ.get("SANDSTORM_OUTPUT_MAX_BYTES", str(DEFAULT_MAX_BYTES)),
        help=f"budget of saved command output; 0: none (default: $SANDSTORM_OUTPUT_MAX_BYTES, else {DEFAULT_MAX_BYTES})",
    )
    parser.add_argument(
        "--output-dir",
        default=default_output_dir(),
        help="the executor's own directory of saved command output and background logs, outside the workspace "
        "(default: $SANDSTORM_OUTPUT_DIR, else output/ in systemd's $STATE_DIRECTORY, else "
        "~/.local/state/sandstorm-mcp/output)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=os.environ.get("SANDSTORM_LOG_FORMAT", "json").strip().lower() or "json",
        help="log lines as JSON objects (as the server does) or text (default: $SANDSTORM_LOG_FORMAT, else json)",
    )
    parser.add_argument(
        "--hide",
        action="append",
        default=[p for p in os.environ.get("SANDSTORM_CONFINE_HIDE", "").split(os.pathsep) if p],
        help="a tree a workspace-confined command may neither read nor write (repeatable; default: "
        "$SANDSTORM_CONFINE_HIDE, paths separated by ':')",
    )
    parser.add_argument(
        "--kernel-confinement",
        choices=("auto", "off"),
        default=os.environ.get("SANDSTORM_KERNEL_CONFINEMENT", "auto").strip().lower() or "auto",
        help="auto: the kernel's sandbox (Landlock) where it has one; off: none, for the git layer's defences alone "
        "(default: $SANDSTORM_KERNEL_CONFINEMENT, else auto)",
    )
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (a child of the server)")
    parser.add_argument(
        "--channel-fd",
        type=int,
        help="instead of a socket file: an inherited socket the server sends each connection down (SCM_RIGHTS); "
        "the development child, see child.py",
    )
    options = parser.parse_args(argv)
    options.inherited = inherited_listener()
    if options.socket is None and options.inherited is None and options.channel_fd is None:
        parser.error("--socket is required unless systemd passes a listening socket (socket activation)")
    return options


def inherited_listener() -> socket.socket | None:
    """The listening socket systemd passed (socket activation: LISTEN_PID and LISTEN_FDS, first fd 3), if any.

    systemd then owns the socket file (in root's /run, where the agent user cannot replace it) and keeps it
    accepting connections while the executor restarts: calls wait instead of failing.
    """
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or os.environ.get("LISTEN_FDS", "0") == "0":
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # meant for this process only, not the tools it starts
    listener = socket.socket(fileno=SD_LISTEN_FDS_START)
    if listener.family != socket.AF_UNIX:
        raise SystemExit(f"the socket systemd passed is not a Unix socket ({listener.family!r})")
    return listener


async def serve(options: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    allow = [name.strip() for name in options.env_allow.split(",") if name.strip()]
    rlimits.configure(ToolLimits(max_processes=options.max_processes, max_memory=options.max_memory))
    try:
        local = LocalExecutor(options.workspace, allow, options.output_max_bytes, options.output_dir)
    except OutputDirInWorkspace as error:
        raise SystemExit(f"--output-dir: {error}") from None
    hidden = [*options.hide, str(local.saved_output.create())]  # other users' output: no confined command's to read
    sandboxes = confinement.build(
        os.path.realpath(options.workspace), hidden, enabled=options.kernel_confinement == "auto"
    )
    confinement.configure(sandboxes)
    # Named after the saved-output directory: one per installation, shared by the executor a management command
    # starts in development, so that its revocation reaches what the server's executor started.
    tracking = credential_groups.set_up(os.path.realpath(options.output_dir))
    credential_groups.configure(tracking)
    service = ExecutorService(local, options.allow_uid)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if options.watch_stdin:

        def on_stdin() -> None:
            if not os.read(sys.stdin.fileno(), 4096):  # end of file: the server went away
                stop.set()

        loop.add_reader(sys.stdin.fileno(), on_stdin)
    close: Callable[[], None]
    if options.channel_fd is not None:  # the development child: connections come down its channel, no socket file
        handed_over = HandedOver(service, socket.socket(fileno=options.channel_fd), stop)
        where, close = "its channel from the server", handed_over.close
    else:
        listener = options.inherited or bind_socket(options.socket)
        server = await asyncio.start_unix_server(service.handle, sock=listener)
        where, close = listener.getsockname(), server.close
    identity = service.identity()
    logger.info(
        "executor ready on %s as %s (uid %d), workspace %s, serving uid %d; limits: %s processes per command, "
        "%s bytes of memory per process, %s bytes of saved output",
        where, identity["user"], identity["uid"], identity["root"], options.allow_uid,
        options.max_processes or "no", options.max_memory or "no", options.output_max_bytes or "no",
    )  # fmt: skip
    logger.info("kernel confinement: %s", confinement.summary(sandboxes.describe()))
    logger.info("processes of each credential, for revocation: %s", tracking.describe())
    try:
        await stop.wait()
    finally:
        close()
        await service.cancel_all()
        tracking.close()
        if options.inherited is None and options.socket is not None:
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
