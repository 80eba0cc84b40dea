"""The production layout: the server runs as one throwaway OS user, the executor (the tools) as another.

What a prompt-injected agent can reach through the tools must exclude the server's state dir (database, secret key,
audit key), the server's process and the executor's socket; it keeps its workspace. The users are created here and
removed afterwards, which needs root: CI runs as root, so these tests run there.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import httpx2
import pytest

from tests.database import ON_POSTGRES
from tests.live import (
    REPO,
    START_DEADLINE,
    LiveServer,
    command_the_server_tracks,
    live_pids_with,
    make_server,
    mcp_client,
    poll,
    text_of,
)

pytestmark = [
    pytest.mark.live,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating the two OS users of the production layout needs root"),
]


def world_usable_python(workdir: Path) -> str:
    """An interpreter both throwaway users can run, seeing this suite's packages.

    The suite's own interpreter may live where other users cannot enter (pyenv under /root, 0700), so a virtualenv
    is made from the distribution's python3 of the same version, with a .pth that adds this suite's site-packages.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system_python = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system_python is None:
        pytest.fail(f"no /usr/bin/{version} for the agent and server users to run (.ci/run installs python3)")
    venv = workdir / "venv"
    subprocess.run([system_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_packages = venv / "lib" / version / "site-packages"
    (site_packages / "sandstorm-suite.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    return str(venv / "bin" / "python")


def create_user(name: str, home: Path, shell: str) -> pwd.struct_passwd:
    subprocess.run(
        ["useradd", "--system", "--user-group", "--home-dir", str(home), "--no-create-home", "--shell", shell, name],
        check=True,
    )
    return pwd.getpwnam(name)


def remove_user(name: str) -> None:
    subprocess.run(["pkill", "-KILL", "-u", name], check=False)
    subprocess.run(["userdel", name], check=False, capture_output=True)


class RunAs(TypedDict):
    """The keyword arguments of subprocess.run and Popen that run a child as another account."""

    user: int
    group: int
    extra_groups: list[int]


def as_user(account: pwd.struct_passwd) -> RunAs:
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


@dataclass
class SeparatedServer(LiveServer):
    """A LiveServer whose commands and process run as the server user, with a separate executor."""

    python: str = ""
    account: pwd.struct_passwd | None = None

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.account is not None
        command = [self.python, "manage.py", *args]
        return subprocess.run(
            command,
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
            **as_user(self.account),
        )

    def start(self) -> None:
        assert self.account is not None
        bootstrap = self.manage("bootstrap", check=False)
        assert bootstrap.returncode == 0, bootstrap.stdout + bootstrap.stderr
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [self.python, "manage.py", "serve"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            **as_user(self.account),
        )
        poll(self.healthy, START_DEADLINE, what="the server's /health")


@dataclass
class Layout:
    server: SeparatedServer
    server_user: pwd.struct_passwd
    agent: pwd.struct_passwd
    python: str
    socket: str
    workspace: Path
    executor: subprocess.Popen[bytes] | None = None

    def start_executor(self) -> None:
        Path(self.socket).unlink(missing_ok=True)  # a killed executor leaves its socket behind
        argv = [self.python, "-m", "mcpserver.executor", "--socket", self.socket, "--workspace", str(self.workspace)]
        argv += ["--allow-uid", self.server_user.pw_name]
        self.executor = subprocess.Popen(
            argv, cwd=REPO, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, **as_user(self.agent)
        )
        poll(lambda: os.path.exists(self.socket), 30, what="the executor's socket")

    def stop_executor(self, sig: int = signal.SIGTERM) -> None:
        if self.executor is not None and self.executor.poll() is None:
            self.executor.send_signal(sig)
            self.executor.wait(15)


@pytest.fixture(scope="module")
def layout() -> Iterator[Layout]:
    suffix = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="sst-privsep-"))
    os.chmod(root, 0o755)
    names = (f"sst-srv-{suffix}", f"sst-agent-{suffix}")
    try:
        server_user = create_user(names[0], root / "state", "/usr/sbin/nologin")
        agent = create_user(names[1], root / "agent", "/bin/bash")
        python = world_usable_python(root)
        workspace = root / "agent" / "workspace"
        workspace.mkdir(parents=True)
        for path in (root / "agent", workspace):
            os.chown(path, agent.pw_uid, agent.pw_gid)
            os.chmod(path, 0o750)
        state = root / "state"
        state.mkdir(mode=0o700)
        os.chown(state, server_user.pw_uid, server_user.pw_gid)
        run = root / "run"
        run.mkdir(mode=0o755)
        os.chown(run, agent.pw_uid, agent.pw_gid)
        socket_path = str(run / "executor.sock")
        base = make_server(
            root / "server",
            SANDSTORM_STATE_DIR=str(state),
            SANDSTORM_WORKSPACE_ROOT=str(workspace),
            SANDSTORM_EXECUTOR_SOCKET=socket_path,
            HOME=str(state),
        )
        server = SeparatedServer(
            root=base.root, port=base.port, env=base.env, token=base.token, admin_password=base.admin_password,
            python=python, account=server_user,
        )  # fmt: skip
        found = Layout(server, server_user, agent, python, socket_path, workspace)
        found.start_executor()
        server.start()
        yield found
        server.stop()
        found.stop_executor()
    finally:
        for name in names:
            remove_user(name)
        shutil.rmtree(root, ignore_errors=True)


async def run(layout: Layout, command: str) -> tuple[str, bool]:
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        result = await client.call_tool("terminal_exec", {"command": command})
    return text_of(result), bool(result.is_error)


async def read(layout: Layout, path: str) -> tuple[str, bool]:
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        result = await client.call_tool("file_read", {"path": path})
    return text_of(result), bool(result.is_error)


def secret_paths(layout: Layout) -> list[str]:
    state = layout.server.state_dir
    paths = [str(state / "secret_key"), str(state / "audit_key")]
    if not ON_POSTGRES:
        paths.append(str(state / "sandstorm.sqlite3"))
    assert layout.server.process is not None
    paths.append(f"/proc/{layout.server.process.pid}/environ")
    return paths


async def test_tools_run_as_the_agent_user_with_its_home(layout: Layout) -> None:
    text, failed = await run(layout, 'id -un; echo "$HOME $USER"')
    assert not failed
    assert f"{layout.agent.pw_name}\n{layout.agent.pw_dir} {layout.agent.pw_name}\n" in text
    health = httpx2.get(f"{layout.server.url}/health").json()
    assert health["executor"] == {**health["executor"], "ok": True, "mode": "service", "user": layout.agent.pw_name}


async def test_the_agent_cannot_read_the_servers_secrets_database_or_environment(layout: Layout) -> None:
    for path in secret_paths(layout):
        assert os.path.exists(path), path
        text, _ = await run(layout, f'cat {path} | head -c 100 | od -c | head -3; echo "exit=${{PIPESTATUS[0]}}"')
        assert "Permission denied" in text and "exit=1" in text, (path, text)
        text, failed = await read(layout, path)
        assert failed and "outside the allowed directory" in text, (path, text)


async def test_a_symlink_to_a_secret_gets_the_agent_nothing(layout: Layout) -> None:
    key = layout.server.state_dir / "secret_key"
    text, failed = await run(layout, f"ln -sf {key} leak && cat leak")
    assert failed or "Permission denied" in text
    assert key.read_text().strip() not in text
    text, failed = await read(layout, "leak")
    assert failed and "outside the allowed directory" in text


async def test_the_agent_cannot_rewrite_the_audit_log(layout: Layout) -> None:
    if ON_POSTGRES:
        # The database server is reachable over TCP, but its password is only in the server's environment.
        text, _ = await run(layout, "env")
        assert layout.server.env["DATABASE_URL"] not in text and "DATABASE_URL" not in text
    else:
        database = layout.server.state_dir / "sandstorm.sqlite3"
        delete = "DELETE FROM audit_auditrecord"
        text, _ = await run(layout, f"sqlite3 {database} '{delete}' 2>&1; ls -l {database} 2>&1")
        assert "unable to open" in text or "Permission denied" in text or "not found" in text, text
        script = f"import sqlite3; sqlite3.connect('{database}').execute('{delete}')"
        text, _ = await run(layout, f'python3 -c "{script}"')
        assert "unable to open database file" in text, text
    assert layout.server.manage("audit_verify", check=False).returncode == 0
    assert layout.server.database.query("SELECT COUNT(*) AS n FROM audit_auditrecord")[0]["n"] > 0


async def test_the_agent_cannot_talk_to_the_executor_or_signal_the_server(layout: Layout) -> None:
    probe = (  # noqa: UP031 - the probe's source has braces of its own, which format() would need doubled
        "import socket, struct; s = socket.socket(socket.AF_UNIX); s.connect(%r); "
        'body = b\'{"op":"ping","args":{}}\'; s.sendall(struct.pack(\'>I\', len(body)) + body); '
        "print(s.recv(4096)[4:].decode())"
    ) % layout.socket
    text, _ = await run(layout, f"python3 -c {json.dumps(probe)}")
    assert f"peer uid {layout.agent.pw_uid} is not the server's uid {layout.server_user.pw_uid}" in text, text
    assert layout.server.process is not None
    text, _ = await run(layout, f"kill -0 {layout.server.process.pid}")
    assert "Operation not permitted" in text
    text, _ = await run(layout, "sudo -n true")
    assert "exit_code: 0" not in text


async def test_the_agent_works_in_its_workspace_and_owns_what_it_creates(layout: Layout) -> None:
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        wrote = await client.call_tool("file_write", {"path": "notes/plan.md", "content": "step one\n"})
        assert not wrote.is_error, text_of(wrote)
        made = await client.call_tool("terminal_exec", {"command": "echo built > out.txt && cat notes/plan.md"})
        assert "step one" in text_of(made)
        listed = await client.call_tool("file_list", {"path": "."})
        assert "out.txt" in text_of(listed) and "notes" in text_of(listed)
    for path in (layout.workspace / "notes" / "plan.md", layout.workspace / "out.txt"):
        assert path.stat().st_uid == layout.agent.pw_uid, path


async def test_a_background_process_survives_a_server_restart_and_terminal_kill_still_reaches_it(
    layout: Layout,
) -> None:
    marker = f"bg-{uuid.uuid4().hex}"
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        started = text_of(await client.call_tool("terminal_exec_background", {"command": f"sleep 300; : {marker}"}))
    pid = int(started.split("PID: ")[1].split()[0])
    layout.server.stop()
    layout.server.start()
    assert pid in live_pids_with(marker)
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        killed = await client.call_tool("terminal_kill", {"pid": pid})
    assert not killed.is_error, text_of(killed)
    poll(lambda: pid not in live_pids_with(marker), 15, what="the background process to end")


async def test_revoke_token_on_the_shell_stops_the_tokens_background_processes_through_the_agents_executor(
    layout: Layout,
) -> None:
    """With the server down, so the command itself must reach the executor (another user's process) through its
    socket, as `sandstorm-manage` lets it."""
    name, marker, kept_marker = f"bg-{uuid.uuid4().hex[:8]}", f"revoked-{uuid.uuid4().hex}", f"kept-{uuid.uuid4().hex}"
    token = layout.server.manage("create_token", name).stdout.strip().splitlines()[-1]
    async with mcp_client(layout.server.mcp_url, token) as client:
        started = text_of(await client.call_tool("terminal_exec_background", {"command": f"sleep 300; : {marker}"}))
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        kept = text_of(await client.call_tool("terminal_exec_background", {"command": f"sleep 300; : {kept_marker}"}))
    pid, kept_pid = (int(text.split("PID: ")[1].split()[0]) for text in (started, kept))
    assert os.stat(f"/proc/{pid}").st_uid == layout.agent.pw_uid
    layout.server.stop()
    try:
        layout.server.manage("revoke_token", name)
        poll(lambda: pid not in live_pids_with(marker), 15, what="the revoked token's background process to end")
        assert kept_pid in live_pids_with(kept_marker), "another credential's process is untouched"
    finally:
        layout.server.start()
    code = "from audit.models import AuditRecord; print([r.detail['pids'] for r in AuditRecord.objects.filter(event='credentials.background_stopped')])"
    assert str([pid]) in layout.server.manage("shell", "--no-imports", "-c", code).stdout
    os.killpg(kept_pid, signal.SIGKILL)


async def test_a_dead_executor_fails_calls_clearly_and_health_says_so_until_it_is_back(layout: Layout) -> None:
    marker = f"lost-{uuid.uuid4().hex}"
    async with mcp_client(layout.server.mcp_url, layout.server.token) as client:
        async with command_the_server_tracks(client, marker) as results:
            layout.stop_executor(signal.SIGKILL)
        assert "tool executor stopped during this call" in text_of(results[0])
        refused = await client.call_tool("file_list", {"path": "."})
        assert refused.is_error and "tool executor is not running" in text_of(refused)
        assert httpx2.get(f"{layout.server.url}/health").status_code == 503
        layout.start_executor()  # what systemd's Restart=always does
        back = await client.call_tool("terminal_exec", {"command": "echo back"})
        assert "back" in text_of(back) and not back.is_error
    assert httpx2.get(f"{layout.server.url}/health").status_code == 200
    poll(lambda: not live_pids_with(marker), 15, what="the orphaned command to end")
    outcomes = layout.server.database.query(
        "SELECT outcome FROM audit_auditrecord WHERE kind='call.finished' AND call_id IN "
        "(SELECT call_id FROM audit_auditrecord WHERE kind='call.started' AND CAST(arguments AS TEXT) LIKE %s)",
        f"%{marker}%",
    )
    assert [row["outcome"] for row in outcomes] == ["interrupted"]
