"""Limits on tool processes (development mode): a fork flood and a memory hog through terminal_exec.

The server is given small limits (SANDSTORM_TOOL_MAX_PROCESSES, SANDSTORM_TOOL_MAX_MEMORY). RLIMIT_NPROC never binds
root, so as root (CI) the server runs as a throwaway OS user, server and executor alike as a developer's would;
otherwise as ourselves. Every flood is bounded in count and time, and reaps its own children.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from mcpserver.executor.rlimits import host_task_count
from tests.live import LiveServer, apoll, make_server, mcp_client, text_of
from tests.test_privsep_live import SeparatedServer, create_user, remove_user, world_usable_python

pytestmark = [pytest.mark.live, pytest.mark.anyio]

MAX_PROCESSES = 64
MAX_MEMORY = 256 * 1024 * 1024
OUTPUT_BUDGET = 1_000_000
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Forks up to argv[1] children that wait for the parent (a pipe it holds); says how far it got, holds until
# argv[3] exists (or 30 s), then lets the children go and reaps them.
FLOOD = """
import os, sys, time
attempts, holding, release = int(sys.argv[1]), sys.argv[2], sys.argv[3]
read_end, write_end = os.pipe()
children = []
try:
    while len(children) < attempts:
        pid = os.fork()
        if pid == 0:
            os.close(write_end)
            os.read(read_end, 1)
            os._exit(0)
        children.append(pid)
    print("forked all", len(children))
except BlockingIOError:
    print("refused after", len(children))
open(holding, "w").close()
deadline = time.monotonic() + 30
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
os.close(write_end)
for pid in children:
    os.waitpid(pid, 0)
"""

# Takes memory a MiB at a time, at most 1 GiB (bounded even without a limit), and says how much it got.
HOG = """
chunks = []
try:
    for _ in range(1024):
        chunks.append(bytearray(1 << 20))
    print("took all", len(chunks), "MiB")
except MemoryError:
    got = len(chunks)
    chunks.clear()
    print("MemoryError after", got, "MiB")
    raise
"""


@pytest.fixture(scope="module")
def limited_server() -> Iterator[LiveServer]:
    root = Path(tempfile.mkdtemp(prefix="sst-limits-"))
    os.chmod(root, 0o755)
    limits = {
        "SANDSTORM_TOOL_MAX_PROCESSES": str(MAX_PROCESSES),
        "SANDSTORM_TOOL_MAX_MEMORY": str(MAX_MEMORY),
        "SANDSTORM_OUTPUT_MAX_BYTES": str(OUTPUT_BUDGET),
        "PATH": TOOL_PATH,
    }
    name = f"sst-lim-{uuid.uuid4().hex[:6]}"
    try:
        if os.geteuid() != 0:
            server = make_server(root / "server", **limits)
        else:
            account = create_user(name, root / "server", "/bin/bash")
            base = make_server(root / "server", HOME=str(root / "server"), **limits)
            subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", str(root / "server")], check=True)
            server = SeparatedServer(
                root=base.root, port=base.port, env=base.env, token=base.token, admin_password=base.admin_password,
                python=world_usable_python(root), account=account,
            )  # fmt: skip
        server.start()
        yield server
        server.stop()
    finally:
        if os.geteuid() == 0:
            remove_user(name)
        shutil.rmtree(root, ignore_errors=True)


async def run(server: LiveServer, command: str, timeout: float = 30) -> tuple[str, bool]:
    async with mcp_client(server.mcp_url, server.token) as client:
        result = await client.call_tool("terminal_exec", {"command": command, "timeout": timeout})
    return text_of(result), bool(result.is_error)


async def test_a_fork_flood_stops_at_the_limit_while_the_server_and_other_commands_keep_working(
    limited_server: LiveServer,
) -> None:
    workspace = limited_server.workspace
    holding, release = workspace / "flood-holding", workspace / "flood-release"
    # The limit is the host's task count at spawn plus MAX_PROCESSES; well past it, a flood that is not stopped
    # gets all its children.
    attempts = host_task_count() + MAX_PROCESSES + 400
    outcome: dict[str, tuple[str, bool]] = {}

    async def flood() -> None:
        outcome["flood"] = await run(limited_server, f"python3 -c '{FLOOD}' {attempts} {holding} {release}", 60)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(flood)
            await apoll(lambda: holding.exists() or "flood" in outcome, 60, "the flood to hold its children")
            alive, failed = await run(limited_server, "echo alive")  # a new command may add its own tasks
            assert not failed and "alive" in alive, alive
            assert httpx2.get(f"{limited_server.url}/health", timeout=10).status_code == 200
            release.touch()
    finally:
        release.touch()
    text, _ = outcome["flood"]
    assert "refused after" in text, text
    assert int(text.split("refused after")[1].split()[0]) < attempts


async def test_a_command_cannot_raise_its_process_or_memory_limit_again(limited_server: LiveServer) -> None:
    # The memory limit is the executor's own hard limit, inherited; the process limit is pinned right after the spawn.
    # The pinned process limit is the host's task count when the executor last read it, plus MAX_PROCESSES: other
    # processes on a busy machine move that count by hundreds, so the check is that the pin holds, not its value.
    pinned = "sleep 0.5; ulimit -Hu; "
    raise_them = "for f in -d -u; do ulimit -H $f unlimited; ulimit -S $f unlimited; done 2>/dev/null; "
    text, _ = await run(limited_server, pinned + raise_them + "ulimit -Sd; ulimit -Su; ulimit -Hu")
    before, data, soft, hard = text.removeprefix("stdout:\n").split("\n")[:4]
    assert data == str(MAX_MEMORY // 1024), text
    assert before != "unlimited" and int(before) > MAX_PROCESSES, text
    assert soft == hard == before, text


async def test_a_memory_hog_gets_a_memory_error_at_the_limit(limited_server: LiveServer) -> None:
    text, failed = await run(limited_server, f"python3 -c '{HOG}'")
    assert failed and "MemoryError" in text and "took all" not in text, text
    assert "exit_code: 1" in text


async def test_ordinary_tools_still_work_under_the_limits(limited_server: LiveServer) -> None:
    commands = ["git --version", "python3 -c 'print(6 * 7)'", "bash -c 'for i in 1 2 3; do (true); done; echo loop'"]
    if shutil.which("node", path=TOOL_PATH):
        commands.append("node -e 'console.log(40 + 2)'")
    for command in commands:
        text, failed = await run(limited_server, command)
        assert not failed, (command, text)


async def test_a_flood_of_large_outputs_stops_at_the_output_budget_and_each_result_says_what_was_not_saved(
    limited_server: LiveServer,
) -> None:
    output = limited_server.state_dir / "output"
    texts = []
    async with mcp_client(limited_server.mcp_url, limited_server.token) as client:
        for _ in range(12):  # 12 x 588,895 bytes of output: seven times the budget
            result = await client.call_tool("terminal_exec", {"command": "seq 1 100000"})
            texts.append(text_of(result))
    assert all(text.startswith("stdout:\n1\n2\n") and "99999\n100000" in text for text in texts)  # head and tail
    assert sum(path.stat().st_size for path in output.iterdir()) < OUTPUT_BUDGET + 1000
    assert "the whole stdout was not saved" in texts[-1] and "SANDSTORM_OUTPUT_MAX_BYTES" in texts[-1], texts[-1]
