"""`make run`: bind the port, bootstrap, serve under Daphne, and print bootstrap's banner (with the secrets of a
first run) only once the server answers at /health.

The port is bound first, so a taken one stops everything in one line before a migration or a secret is made. Then
`bootstrap` runs (a process of its own; its banner is kept, not printed), and this process becomes Daphne on the
bound socket. A small announcer process, forked before, waits for /health and prints the banner; if Daphne ends
first, the announcer keeps a banner with secrets in a 0600 file and says where, instead of losing them.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from mcpserver.listening import daphne_endpoint, listen_tcp
from mcpserver.management.commands.bootstrap import SHOWN_ONCE
from mcpserver.management.commands.serve import exec_daphne
from mcpserver.start_check import add_accept_argument

# How often the announcer asks /health, and how long it waits for a 200 before printing the banner with a warning.
HEALTH_INTERVAL = 0.1
HEALTH_PATIENCE = 60.0
KEPT_BANNER = "unshown-banner.txt"


def health_url(host: str, port: int) -> str:
    """Where this machine reaches the server: a wildcard address is asked on loopback."""
    bare = host.strip("[]")
    bare = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(bare, bare)
    return f"http://{f'[{bare}]' if ':' in bare else bare}:{port}/health"


def health_status(url: str) -> int | None:
    """The HTTP status /health answers with, or None if it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310  (our own http URL)
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return None


def keep_banner(banner: str) -> Path:
    path = Path(settings.STATE_DIR) / KEPT_BANNER
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(banner)
    path.chmod(0o600)  # an older file of another mode is truncated, not re-created
    return path


def announce(banner: str, url: str, server_alive: int) -> None:
    """Print `banner` once `url` answers 200 (or, after HEALTH_PATIENCE, anything); `server_alive` reads EOF when
    the server has ended."""
    started, last = time.monotonic(), None
    while True:
        last = health_status(url)
        if last == 200 or (last is not None and time.monotonic() - started > HEALTH_PATIENCE):
            break
        ended, _, _ = select.select([server_alive], [], [], HEALTH_INTERVAL)
        if ended:  # EOF: every copy of the write end, Daphne's included, is closed
            if SHOWN_ONCE in banner:
                path = keep_banner(banner)
                sys.stderr.write(
                    f"Sandstorm did not start (see above). The first admin password and token, shown once, are "
                    f"kept in {path} (yours alone): read it, then delete it.\n"
                )
            return
    sys.stdout.write(banner)
    if last != 200:
        sys.stdout.write(f"Warning: {url} answers {last}, not 200: tool calls may fail (see the log above).\n")
    sys.stdout.flush()


class Command(BaseCommand):
    help = (
        "What `make run` runs: listen on SANDSTORM_MCP_HOST:SANDSTORM_MCP_PORT, bootstrap (the start-up check of the "
        "database, migrations; on first run the admin user and a token), serve under Daphne, and print the banner "
        "once the server answers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_accept_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        listener = listen_tcp(settings.MCP_HOST, settings.MCP_PORT)
        # bootstrap runs the start-up check (mcpserver.start_check): a refusal is its one line and exit status.
        accept = ["--accept-audit-loss"] if options["accept_audit_loss"] else []
        bootstrap = subprocess.run(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "bootstrap", *accept],
            cwd=settings.BASE_DIR,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if bootstrap.returncode:
            self.stdout.write(bootstrap.stdout, ending="")
            sys.exit(bootstrap.returncode)
        self.stdout.write(f"Starting Daphne: {settings.PUBLIC_URL} (Ctrl-C to stop)")
        sys.stdout.flush()
        start_announcer(bootstrap.stdout, health_url(settings.MCP_HOST, settings.MCP_PORT), listener)
        exec_daphne(daphne_endpoint(listener, settings.MCP_HOST, settings.MCP_PORT))


def start_announcer(banner: str, url: str, listener: socket.socket) -> None:
    """Fork the announcer (twice, so that it is nobody's zombie: Daphne would never reap it)."""
    alive_read, alive_write = os.pipe()
    os.set_inheritable(alive_write, True)  # kept open across the exec, by Daphne, for as long as it lives
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for Daphne; the announcer sees it end
                listener.close()
                os.close(alive_write)
                try:
                    announce(banner, url, alive_read)
                except OSError as error:  # the banner file or the terminal: say so, the server runs on
                    sys.stderr.write(f"manage.py run: could not print the banner: {error}\n")
        finally:
            os._exit(0)
    os.close(alive_read)
    os.waitpid(child, 0)
