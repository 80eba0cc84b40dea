"""The shell line that connects Claude Code to this server with a bearer token, as every page and command prints it.

It removes an earlier `sandstorm` entry first, so the same line works again after a rotation or a new token, and
adds the server for the user (`-s user`), so it is there in every project.
"""

from __future__ import annotations

import shlex

SERVER_NAME = "sandstorm"


def claude_code_line(mcp_url: str, secret: str) -> str:
    header = shlex.quote(f"Authorization: Bearer {secret}")
    return (
        f"claude mcp remove -s user {SERVER_NAME} 2>/dev/null; "
        f"claude mcp add -s user --transport http {SERVER_NAME} {shlex.quote(mcp_url)} --header {header}"
    )
