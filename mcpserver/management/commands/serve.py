from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

# sd_listen_fds(3): the first socket systemd passes is file descriptor 3.
SYSTEMD_FIRST_FD = 3


class Command(BaseCommand):
    help = "Run Sandstorm under Daphne on SANDSTORM_MCP_HOST:SANDSTORM_MCP_PORT (or a Unix socket)."

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP")
        where.add_argument(
            "--systemd-socket",
            action="store_true",
            help="serve on the Unix socket systemd passes (sandstorm-mcp.socket; production)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Daphne's own access log records query strings (a token could sit there): sandstorm_site.accesslog
        # logs requests instead. Verbosity 0 with no --access-log turns it off (1 would print it on stdout); our
        # logging configuration, not Daphne's, sets the levels. `-m daphne`: the interpreter we run under.
        argv = [sys.executable, "-m", "daphne", "--verbosity", "0"]
        if options["systemd_socket"]:
            argv += ["--proxy-headers", "-e", f"fd:domain=UNIX:fileno={systemd_socket_fd()}"]
        elif options["unix_socket"]:
            argv += ["--proxy-headers", "-u", options["unix_socket"]]
        else:
            argv += ["-b", settings.MCP_HOST, "-p", str(settings.MCP_PORT)]
        argv.append("sandstorm_site.asgi:application")
        self.stdout.write(f"Starting Daphne: {settings.PUBLIC_URL} (Ctrl-C to stop)")
        sys.stdout.flush()
        os.chdir(settings.BASE_DIR)
        os.execv(sys.executable, argv)


def systemd_socket_fd() -> int:
    """The one listening socket systemd passed to this process (LISTEN_FDS/LISTEN_PID), which Daphne adopts."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or os.environ.get("LISTEN_FDS") != "1":
        raise CommandError(
            "--systemd-socket needs the one socket systemd passes (LISTEN_FDS=1 for this process): "
            "start the server with `systemctl start sandstorm-mcp` (sandstorm-mcp.socket), not by hand"
        )
    return SYSTEMD_FIRST_FD
