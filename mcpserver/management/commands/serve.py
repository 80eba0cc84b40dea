from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcpserver.listening import daphne_endpoint, listen_tcp
from mcpserver.start_check import add_accept_argument, run_before_start

# sd_listen_fds(3): the first socket systemd passes is file descriptor 3.
SYSTEMD_FIRST_FD = 3


class Command(BaseCommand):
    help = (
        "Run Sandstorm under Daphne on SANDSTORM_MCP_HOST:SANDSTORM_MCP_PORT (or a Unix socket), after the start-up "
        "check of the database (see bootstrap)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP")
        where.add_argument(
            "--systemd-socket",
            action="store_true",
            help="serve on the Unix socket systemd passes (sandstorm-mcp.socket; production)",
        )
        add_accept_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        run_before_start(options["accept_audit_loss"], self.stderr)  # before Daphne opens the database
        if options["systemd_socket"]:
            require_systemd_socket()
            # Served without Twisted taking the socket over, so a stop leaves it listening for the next server
            # (mcpserver/inherited_socket.py); the endpoint's parser is a Twisted plugin found on this path.
            plugins = str(Path(settings.BASE_DIR) / "mcpserver" / "twisted_plugins")
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (plugins, os.environ.get("PYTHONPATH"))))
            where = ["--proxy-headers", "-e", f"sandstorm-inherited:fd={SYSTEMD_FIRST_FD}"]
        elif options["unix_socket"]:
            where = ["--proxy-headers", "-u", options["unix_socket"]]
        else:
            # Bound here, before Daphne: a taken port is one line naming SANDSTORM_MCP_PORT, not a Twisted traceback.
            # Held in a variable: the socket must stay open (not be collected) until the exec below.
            listener = listen_tcp(settings.MCP_HOST, settings.MCP_PORT)
            where = daphne_endpoint(listener, settings.MCP_HOST, settings.MCP_PORT)
        self.stdout.write(f"Starting Daphne: {settings.PUBLIC_URL} (Ctrl-C to stop)")
        sys.stdout.flush()
        exec_daphne(where)


def daphne_argv(where: list[str]) -> list[str]:
    # Daphne's own access log records query strings (a token could sit there): sandstorm_site.accesslog logs
    # requests instead. Verbosity 0 with no --access-log turns it off (1 would print it on stdout); our logging
    # configuration, not Daphne's, sets the levels. `-m daphne`: the interpreter we run under.
    return [sys.executable, "-m", "daphne", "--verbosity", "0", *where, "sandstorm_site.asgi:application"]


def exec_daphne(where: list[str]) -> None:
    """Become Daphne (same pid: signals and exit codes are Daphne's), serving on `where`."""
    os.chdir(settings.BASE_DIR)
    os.execv(sys.executable, daphne_argv(where))


def require_systemd_socket() -> None:
    """Refuse to start unless systemd passed a listening Unix socket as fd 3 (sandstorm-mcp.socket).

    Checked on the descriptor itself, not through LISTEN_PID/LISTEN_FDS: importing Daphne (Django's app loading)
    has Twisted take those variables out of the environment before this command runs.
    """
    try:
        listener = socket.socket(fileno=SYSTEMD_FIRST_FD)
    except OSError:
        listener = None
    try:
        listening = (
            listener is not None
            and listener.family == socket.AF_UNIX
            and listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        )
    finally:
        if listener is not None:
            listener.detach()  # the descriptor stays open, for Daphne
    if not listening:
        raise CommandError(
            "--systemd-socket needs the listening Unix socket systemd passes as file descriptor 3: "
            "start the server with `systemctl start sandstorm-mcp` (sandstorm-mcp.socket), not by hand"
        )
