"""The MCP checks of the real-systemd test, run inside the container with the installed venv's interpreter.

The official SDK client over streamable HTTP, through Caddy: https://DOMAIN/mcp resolved by the container's
/etc/hosts to loopback, Caddy's certificate checked against Caddy's local CA. Each subcommand prints one line
(what it saw) and exits non-zero if it is not what a user should see.

    python mcp_check.py DOMAIN CA_FILE TOKEN_FILE exec COMMAND     # prints the command's stdout (exit 0 only)
    python mcp_check.py DOMAIN CA_FILE TOKEN_FILE background COMMAND  # prints the background process's pid
    python mcp_check.py DOMAIN CA_FILE TOKEN_FILE kill PID
    python mcp_check.py DOMAIN CA_FILE TOKEN_FILE grep PATTERN        # prints file_grep's matching files
    python mcp_check.py DOMAIN CA_FILE TOKEN_FILE follow ID           # terminal_output to the end: STATE CODE LINES
    python mcp_check.py DOMAIN CA_FILE TOKEN_FILE sessions N          # N 2025-11-25 sessions, open at once, three
                                                                      # calls each: prints their ids' worker tags
"""

from __future__ import annotations

import re
import ssl
import sys
from contextlib import AsyncExitStack

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def sessions(domain: str, ca_file: str, token: str, count: int) -> int:
    """Open `count` sessions at once through Caddy (handshake and Mcp-Session-Id), then make three calls in each:
    every call of a session must reach the worker holding it. Prints the worker tags of the session ids."""
    context = ssl.create_default_context(cafile=ca_file)
    tags: list[str] = []
    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(count):
            ids: list[str] = []

            async def note(response: httpx2.Response, ids: list[str] = ids) -> None:
                if not ids and response.headers.get("mcp-session-id"):
                    ids.append(response.headers["mcp-session-id"])

            http = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {token}"}, verify=context, event_hooks={"response": [note]}
            )
            await stack.enter_async_context(http)
            transport = streamable_http_client(f"https://{domain}/mcp", http_client=http)
            clients.append(await stack.enter_async_context(Client(transport, mode="legacy")))
            tags.append(ids[0].split("-", 1)[0] if ids else "none")
        for number, client in enumerate(clients):
            for call in range(3):
                result = await client.call_tool("terminal_exec", {"command": f"echo {number}-{call}"})
                if result.is_error or f"{number}-{call}" not in text_of(result):
                    print(f"session {number} ({tags[number]}), call {call}: {text_of(result)[:300]}")
                    return 1
    print(" ".join(tags))
    return 0


async def main(domain: str, ca_file: str, token_file: str, action: str, argument: str) -> int:
    token = open(token_file).read().strip()
    if action == "sessions":
        return await sessions(domain, ca_file, token, int(argument))
    context = ssl.create_default_context(cafile=ca_file)
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, verify=context, timeout=httpx2.Timeout(60, read=120)
    )
    async with http, Client(streamable_http_client(f"https://{domain}/mcp", http_client=http)) as client:
        if action == "exec":
            result = await client.call_tool("terminal_exec", {"command": argument})
            structured = result.structured_content or {}
            if result.is_error or structured.get("exit_code") != 0:
                print(f"terminal_exec failed: {text_of(result)[:500]}")
                return 1
            print(str(structured.get("stdout", "")).strip())
        elif action == "background":
            result = await client.call_tool("terminal_exec_background", {"command": argument})
            found = re.search(r"^PID: (\d+)$", text_of(result), re.M)
            if result.is_error or not found:
                print(f"terminal_exec_background failed: {text_of(result)[:500]}")
                return 1
            print(found.group(1))
        elif action == "kill":
            result = await client.call_tool("terminal_kill", {"pid": int(argument)})
            print(text_of(result))
            return 1 if result.is_error else 0
        elif action == "grep":
            result = await client.call_tool("file_grep", {"pattern": argument})
            if result.is_error:
                print(f"file_grep failed: {text_of(result)[:500]}")
                return 1
            print(" ".join(text_of(result).split()))
        elif action == "follow":
            return await follow(client, int(argument))
        else:
            print(f"unknown action {action!r}")
            return 2
    return 0


async def follow(client: Client, job: int) -> int:
    """Read a background command's output from offset 0 until it has ended; print its state, code and lines."""
    output, offset, state, code = "", 0, "running", None
    while state == "running":
        result = await client.call_tool("terminal_output", {"id": job, "offset": offset, "wait_ms": 10_000})
        structured = result.structured_content or {}
        if result.is_error or "next_offset" not in structured:
            print(f"terminal_output failed: {text_of(result)[:500]}")
            return 1
        text = text_of(result)
        output += text.split("\n\n", 1)[1] if "\n\n" in text else ""
        offset, state, code = structured["next_offset"], structured["state"], structured["exit_code"]
    print(state, code, " ".join(output.split()))
    return 0


if __name__ == "__main__":
    domain, ca_file, token_file, action, argument = sys.argv[1:6]
    sys.exit(anyio.run(main, domain, ca_file, token_file, action, argument))
