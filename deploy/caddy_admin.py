"""Puts Caddy's admin API on a Unix socket in the main Caddyfile's global options, for deploy/install.sh.

Caddy's default admin endpoint, localhost:2019, answers every local user, the agent user included: from a tool
call an agent could read the whole configuration and POST /load a new one (reroute the site, capture tokens). On a
socket in a directory only Caddy's user may enter (the drop-in deploy/systemd/caddy-admin.conf), only Caddy and
root reach it, and `systemctl reload caddy` (Caddy's `caddy reload`, which finds the address in this same file)
still works. Debian 12's Caddy (2.6) reads no CADDY_ADMIN variable, so the address must be in the Caddyfile.

    python3 caddy_admin.py check CADDYFILE SOCKET   # exit 0 if it can be made right, 3 with one line if not
    python3 caddy_admin.py apply CADDYFILE SOCKET   # the file with the option, on stdout; exit 1 if unchanged

Standard library only: it runs with the host's python3, before the virtualenv exists.
"""

from __future__ import annotations

import re
import sys

UNCHANGED, REFUSED = 1, 3
ADMIN = re.compile(r"^\s*admin(?:\s+(?P<value>\S+))?")
BLOCK = (
    "{{\n"
    "\t# Caddy's admin API on a Unix socket only Caddy and root can reach (Sandstorm's deploy/install.sh): on\n"
    "\t# localhost:2019 every local user, an agent's commands too, could rewrite this configuration.\n"
    "\tadmin unix/{socket}\n"
    "}}\n"
)


class Refused(Exception):
    """The Caddyfile sets something this script must not overwrite; the message says what to do."""


def meaningful(lines: list[str]) -> list[int]:
    return [index for index, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]


def global_block(lines: list[str]) -> tuple[int, int] | None:
    """The first and last line of the global options block (`{` and `}` alone on their lines), if there is one."""
    first = meaningful(lines)[:1]
    if not first or not lines[first[0]].lstrip().startswith("{"):
        return None
    start = first[0]
    if lines[start].strip() != "{":
        raise Refused("its global options block starts on a line with more than `{`: put `{` on a line of its own")
    end = next((index for index in range(start + 1, len(lines)) if lines[index].rstrip() == "}"), None)
    if end is None:
        raise Refused("its global options block has no `}` alone at the start of a line")
    return start, end


def with_admin(text: str, socket: str) -> str | None:
    """TEXT with the admin option on SOCKET; None if it already has it (or `admin off`)."""
    lines = text.splitlines(keepends=True)
    block = global_block(lines)
    if block is None:
        at = (meaningful(lines) or [len(lines)])[0]
        return "".join([*lines[:at], BLOCK.format(socket=socket), "\n", *lines[at:]])
    start, end = block
    for line in lines[start + 1 : end]:
        found = ADMIN.match(line)
        if found:
            value = found.group("value")
            if value in (f"unix/{socket}", "off"):
                return None
            raise Refused(
                f"it sets `admin {value or ''}`, which every local user (an agent too) may reach: replace it with "
                f"`admin unix/{socket}` (or `admin off`)"
            )
    option = BLOCK.format(socket=socket).splitlines(keepends=True)[1:-1]
    return "".join([*lines[: start + 1], *option, *lines[start + 1 :]])


def main(action: str, path: str, socket: str) -> int:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        changed = with_admin(text, socket)
    except Refused as refusal:
        print(f"{path}: {refusal}", file=sys.stderr)
        return REFUSED
    if action == "apply":
        if changed is None:
            return UNCHANGED
        sys.stdout.write(changed)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("check", "apply"):
        sys.exit(f"usage: {sys.argv[0]} check|apply CADDYFILE SOCKET")
    sys.exit(main(*sys.argv[1:]))
