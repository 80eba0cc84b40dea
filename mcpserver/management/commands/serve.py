from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run Sandstorm under Daphne on SANDSTORM_MCP_HOST:SANDSTORM_MCP_PORT (or a Unix socket)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP (production)")

    def handle(self, *args: Any, **options: Any) -> None:
        # Daphne's own access log records query strings (a token could sit there): sandstorm_site.accesslog
        # logs requests instead. Verbosity 0 with no --access-log turns it off (1 would print it on stdout); our
        # logging configuration, not Daphne's, sets the levels. `-m daphne`: the interpreter we run under.
        argv = [sys.executable, "-m", "daphne", "--verbosity", "0"]
        if options["unix_socket"]:
            argv += ["--proxy-headers", "-u", options["unix_socket"]]
        else:
            argv += ["-b", settings.MCP_HOST, "-p", str(settings.MCP_PORT)]
        argv.append("sandstorm_site.asgi:application")
        self.stdout.write(f"Starting Daphne: {settings.PUBLIC_URL} (Ctrl-C to stop)")
        sys.stdout.flush()
        os.chdir(settings.BASE_DIR)
        os.execv(sys.executable, argv)
