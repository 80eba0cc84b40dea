"""A throwaway host for deploy/install.sh, which runs for real into its root (SANDSTORM_PREFIX), with fakes for what
only a real host has. The tests are in tests/test_deploy_install*.py, split so that they spread over workers.

The fakes, first on PATH, record every call: `systemctl` (and, for `start`/`restart` of `sandstorm-mcp.service` and
`sandstorm-mcp-executor.service`, it starts the installed unit's ExecStart for real, with the unit's environment, so
the installer's smoke test talks to a real server on the unit's socket, which reaches a real executor on the socket
the executor's unit listens on: the production wiring), `caddy`, `sudo`, `id`, `useradd`/`usermod`/`gpasswd`/`getent`
(a pretend user database), `chown` (records the owner: the users do not exist here), `runuser`, `apt-get`,
`dpkg-query`, `systemd-tmpfiles` (makes the rule's directory), `journalctl`, and Caddy itself: `curl` to
https://DOMAIN resolved to loopback goes to Daphne's socket instead (or fails, with FAKE_CADDY_DOWN). Everything
else (git, tar, install, find, python3 -m venv, pip, curl itself) is real. What only a real systemd and a real
Caddy show (who may connect to the socket, HTTPS, reboots) is tested in tests/systemd/.

Both services run as the user running the tests. So that the smoke test's check "the executor runs the tools as the
agent user" means something here, the agent user is that user (AGENT), and the executor's `--allow-uid` (the server
user's name in the unit, a user that does not exist here) is replaced by that user's uid.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live import REPO, poll

DOMAIN = "mcp.example.test"
DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
INSTALL_TIMEOUT = 600  # the first install creates a virtualenv and installs the dependencies from the index
AGENT = pwd.getpwuid(os.getuid()).pw_name  # the agent user: the one the executor really runs as here

FAKE_COMMON = r"""
import json, os, sys
# sandstorm-manage clears the environment, so the state dir is also found beside the fakes' own directory.
STATE = os.environ.get("FAKE_STATE") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fake-state")
def record(name, argv):
    with open(os.path.join(STATE, "calls.jsonl"), "a") as log:
        log.write(json.dumps({"cmd": name, "argv": argv}) + "\n")
def load(name, default):
    try:
        with open(os.path.join(STATE, name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
def save(name, value):
    with open(os.path.join(STATE, name), "w") as f:
        json.dump(value, f)
args = sys.argv[1:]
"""

FAKES = {
    "systemctl": r'''
import signal, socket, subprocess, time
record("systemctl", args)
units = load("units.json", {"enabled": [], "active": []})
prefix = os.environ["SANDSTORM_PREFIX"]
# The services the fake runs for real, and the name of each one's pid and log files.
REAL = {"sandstorm-mcp-executor.service": "executor", "sandstorm-mcp.service": "server"}
flags = [a for a in args if a.startswith("-")]
words = [a for a in args if not a.startswith("-")]
verb, names = (words[0], words[1:]) if words else ("", [])

def alive(kind):
    pid = load(f"{kind}.json", {}).get("pid")
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()[:1] != "Z"

def stop(kind):
    pid = load(f"{kind}.json", {}).get("pid")
    if pid and alive(kind):
        os.kill(pid, signal.SIGTERM)  # KillMode=process or not: only the main process has anything to stop here
        for _ in range(300):
            if not alive(kind):
                break
            time.sleep(0.05)
    save(f"{kind}.json", {})

def start(unit_name, kind):
    """What systemd would do with the installed unit: its environment (files and lines), run dir, and ExecStart."""
    unit = open(os.path.join(prefix, "etc/systemd/system", unit_name)).read().splitlines()
    settings = {}
    for key, _, value in (l.partition("=") for l in unit if not l.startswith("#")):
        settings.setdefault(key, []).append(value)
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    for line in settings.get("Environment", []):
        key, _, value = line.partition("=")
        env[key] = value
    for path in settings.get("EnvironmentFile", []):
        optional, path = path.startswith("-"), path.lstrip("-")
        if optional and not os.path.exists(path):
            continue
        for line in open(path).read().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value
    argv = settings["ExecStart"][0].split()
    pass_fds = ()
    if "--allow-uid" in argv:  # the server user does not exist here; the server runs as we do
        argv[argv.index("--allow-uid") + 1] = str(os.getuid())
    if "--unix-socket" in argv:
        os.makedirs(os.path.dirname(argv[argv.index("--unix-socket") + 1]), mode=0o750, exist_ok=True)  # RuntimeDirectory=
    else:
        # Socket activation as systemd does it: the socket unit's socket, listening, as fd 3 with LISTEN_PID and
        # LISTEN_FDS. (systemd holds it between runs; here each start makes it anew.)
        socket_unit = open(os.path.join(prefix, "etc/systemd/system", unit_name.replace(".service", ".socket"))).read()
        path = next(l.partition("=")[2] for l in socket_unit.splitlines() if l.startswith("ListenStream="))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(128)
        pass_fds = (listener.fileno(),)
        script = 'fd=$1; shift; if [ "$fd" != 3 ]; then eval "exec 3<&$fd $fd<&-"; fi; export LISTEN_PID=$$ LISTEN_FDS=1; exec "$@"'
        argv = ["sh", "-c", script, "sh", str(listener.fileno()), *argv]
    log = open(os.path.join(STATE, f"{kind}.log"), "ab")
    process = subprocess.Popen(
        argv, cwd=settings["WorkingDirectory"][0], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds
    )
    save(f"{kind}.json", {"pid": process.pid})

status = 0
if verb == "is-enabled":
    status = 0 if all(n in units["enabled"] for n in names) else 1
elif verb == "is-active":
    status = 0 if all((alive(REAL[n]) if n in REAL else n in units["active"]) for n in names) else 3
elif verb in ("enable", "disable"):
    for n in names:
        (units["enabled"].append(n) if verb == "enable" and n not in units["enabled"] else None)
        (units["enabled"].remove(n) if verb == "disable" and n in units["enabled"] else None)
    if "--now" in flags:
        verb = "start" if verb == "enable" else "stop"
if verb in ("start", "restart") and "caddy.service" in names and os.environ.get("FAKE_CADDY_START_FAILS"):
    print("Job for caddy.service failed because the control process exited with error code.", file=sys.stderr)
    sys.exit(1)
if verb in ("start", "restart"):
    for n in names:
        if n in REAL:
            if verb == "restart" or not alive(REAL[n]):
                stop(REAL[n])
                start(n, REAL[n])
        elif n not in units["active"]:
            units["active"].append(n)
elif verb == "stop":
    for n in names:
        if n in REAL:
            stop(REAL[n])
        elif n in units["active"]:
            units["active"].remove(n)
save("units.json", units)
sys.exit(status)
''',
    "caddy": r"""
record("caddy", args)
sys.exit(1 if os.environ.get("FAKE_CADDY_INVALID") else 0)
""",
    "sudo": r"""
record("sudo", args)
if os.environ.get("FAKE_SUDO") != "ok":
    print("Sorry, user tester may not run sudo on this host.", file=sys.stderr)
    sys.exit(1)
if args == ["-v"]:
    sys.exit(0)
while args and args[0].startswith("-"):
    if args.pop(0) == "--":
        break
os.environ["FAKE_ROOT"] = "1"
os.execvp(args[0], args)
""",
    "id": r"""
if args == ["-u"] and os.environ.get("FAKE_UID") and not os.environ.get("FAKE_ROOT"):
    print(os.environ["FAKE_UID"])
    sys.exit(0)
os.execv("/usr/bin/id", ["id", *args])
""",
    "useradd": r"""
record("useradd", args)
db = load("users.json", {"passwd": {}, "group": {"caddy": []}})
name = args[-1]
db["passwd"][name] = {"home": args[args.index("--home-dir") + 1]}
db["group"].setdefault(name, [])
save("users.json", db)
""",
    "usermod": r"""
record("usermod", args)
db = load("users.json", {"passwd": {}, "group": {"caddy": []}})
db["group"][args[args.index("--groups") + 1]].append(args[-1])
save("users.json", db)
""",
    "gpasswd": r"""
record("gpasswd", args)
db = load("users.json", {"passwd": {}, "group": {"caddy": []}})
assert args[0] == "-d", args
user, group = args[1], args[2]
if user not in db["group"].get(group, []):
    print(f"gpasswd: user '{user}' is not a member of '{group}'", file=sys.stderr)
    sys.exit(3)
db["group"][group].remove(user)
save("users.json", db)
""",
    "getent": r"""
db = load("users.json", {"passwd": {}, "group": {"caddy": []}})
database, name = args
if database == "passwd" and name in db["passwd"]:
    print(f"{name}:x:999:999::{db['passwd'][name]['home']}:/bin/sh")
elif database == "group" and name in db["group"]:
    print(f"{name}:x:999:{','.join(db['group'][name])}")
else:
    sys.exit(2)
""",
    "chown": r"""
record("chown", args)
owners = load("owners.json", {})
owners[os.path.abspath(args[-1])] = args[-2]
save("owners.json", owners)
""",
    "stat": r"""
# Ownership as the fake chown left it (the users do not exist here); everything else from the real stat.
owners = load("owners.json", {})
if args[:2] == ["-c", "%U:%G"] and os.path.abspath(args[2]) in owners:
    print(owners[os.path.abspath(args[2])])
    sys.exit(0)
os.execv("/usr/bin/stat", ["stat", *args])
""",
    "runuser": r"""
record("runuser", args[:args.index("--") + 2])
rest = args[args.index("--") + 1:]
os.execvp(rest[0], rest)
""",
    "apt-get": r"""
record("apt-get", args)
""",
    "systemd-tmpfiles": r"""
record("systemd-tmpfiles", args)
for line in open(args[-1]).read().splitlines():
    if line.startswith("d "):
        _, path, mode, *_ = line.split()
        os.makedirs(path, exist_ok=True)
        os.chmod(path, int(mode, 8))
""",
    "journalctl": r"""
print("Error: loading initial config: listen tcp :443: bind: address already in use")
""",
    "curl": r"""
# Caddy: https://DOMAIN resolved to loopback (--resolve) is proxied to Daphne's socket, as plain HTTP.
if "--resolve" in args:
    if os.environ.get("FAKE_CADDY_DOWN"):
        print("curl: (7) Failed to connect to mcp.example.test port 443 after 0 ms: Couldn't connect to server", file=sys.stderr)
        sys.exit(7)
    for option in ("--resolve", "--cacert"):
        at = args.index(option)
        del args[at:at + 2]
    args = ["--unix-socket", os.path.join(os.environ["SANDSTORM_PREFIX"], "run/sandstorm-mcp/worker-1.sock")] + [
        "http://" + a[len("https://"):] if a.startswith("https://") else a for a in args
    ]
os.execv("/usr/bin/curl", ["curl", *args])
""",
    "dpkg-query": r"""
missing = os.environ.get("FAKE_MISSING_PACKAGES", "").split()
print("not-installed" if args[-1] in missing else "installed", end="")
""",
}


@dataclass
class Host:
    """A throwaway root and the fakes' state."""

    prefix: Path
    state: Path
    bin: Path
    repo: Path

    def env(self, **extra: str | None) -> dict[str, str]:
        """The installer's environment; an `extra` of None leaves that variable out."""
        env: dict[str, str | None] = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SANDSTORM_", "DJANGO_", "FAKE_")) and k != "DATABASE_URL"
        }
        env.update(
            PATH=f"{self.bin}:{os.environ['PATH']}",
            SANDSTORM_PREFIX=str(self.prefix),
            SANDSTORM_DOMAIN=DOMAIN,
            SANDSTORM_AGENT_USER=AGENT,
            FAKE_STATE=str(self.state),
        )
        env.update(extra)
        return {k: v for k, v in env.items() if v is not None}

    def install(self, *args: str, check: bool = True, **extra: str | None) -> subprocess.CompletedProcess[str]:
        (self.state / "calls.jsonl").write_text("")
        result = subprocess.run(
            ["bash", str(self.repo / "deploy" / "install.sh"), *args],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
        )
        if check:
            assert result.returncode == 0, (
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\nlogs:\n{self.server_log()}"
            )
        return result

    def calls(self, cmd: str | None = None) -> list[list[str]]:
        lines = (self.state / "calls.jsonl").read_text().splitlines()
        return [entry["argv"] for entry in map(json.loads, lines) if cmd is None or entry["cmd"] == cmd]

    def owners(self) -> dict[str, str]:
        path = self.state / "owners.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def groups(self) -> dict[str, list[str]]:
        """The pretend group database: each group's members."""
        return json.loads((self.state / "users.json").read_text())["group"]

    def pid(self, kind: str) -> int | None:
        """The pid of the server or the executor, as the fake systemctl started it."""
        path = self.state / f"{kind}.json"
        return json.loads(path.read_text()).get("pid") if path.exists() else None

    def server_log(self) -> str:
        """The server's and the executor's output."""
        logs = (self.state / f"{kind}.log" for kind in ("server", "executor"))
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')}" for path in logs if path.exists())

    def stop_server(self) -> None:
        """Stop the server, then the executor."""
        for kind in ("server", "executor"):
            pid = self.pid(kind)
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                    poll(functools.partial(_gone, pid), 20, what=f"the {kind} to stop")
                except ProcessLookupError:
                    pass


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def make_repo(root: Path) -> Path:
    """A clone of this repository holding the working tree (what is being tested), committed: the installer installs
    the committed HEAD, and the units it installs run the code beside them (the executor's unit runs
    `python -m mcpserver.executor`). Edited and new files are copied (ignored ones are not), deleted ones removed."""
    clone = root / "repo"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, clone / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif not source.exists() and target.exists():
            target.unlink()
    commit(clone, "the working tree")
    return clone


def commit(repo: Path, message: str) -> None:
    identity = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t.invalid",
    }
    env = {**os.environ, **identity}
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "--quiet", "--allow-empty", "-m", message], cwd=repo, check=True, env=env)


def make_host(root: Path, repo: Path, os_release: str = DEBIAN_12) -> Host:
    host = Host(prefix=root / "root", state=root / "fake-state", bin=root / "fake-bin", repo=repo)
    for path in (host.prefix / "etc", host.state, host.bin):
        path.mkdir(parents=True)
    (host.prefix / "etc" / "os-release").write_text(os_release)
    for name, body in FAKES.items():
        script = host.bin / name
        script.write_text(f"#!{sys.executable}\n{FAKE_COMMON}\n{body}")
        script.chmod(0o755)
    (host.state / "calls.jsonl").write_text("")
    return host


def manifest(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under `root` with its mode, and for files their checksum and modification time.

    Left out: what the running server itself writes (the database, its socket) and Python's bytecode caches.
    """
    entries: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if "__pycache__" in path.parts or relative.startswith("run/"):
            continue
        info = path.lstat()
        if path.name.startswith("sandstorm.sqlite3"):
            entries[relative] = (stat.filemode(info.st_mode),)
        elif stat.S_ISREG(info.st_mode):
            entries[relative] = (
                stat.filemode(info.st_mode),
                hashlib.sha256(path.read_bytes()).hexdigest(),
                info.st_mtime_ns,
            )
        else:
            entries[relative] = (stat.filemode(info.st_mode),)
    return entries


MUTATING = {"useradd", "usermod", "gpasswd", "chown", "apt-get"}


def changes(host: Host) -> list[list[str]]:
    """Calls that change the host: everything but the fakes' queries (is-active, is-enabled, caddy validate)."""
    found = []
    for line in (host.state / "calls.jsonl").read_text().splitlines():
        entry = json.loads(line)
        argv = entry["argv"]
        if entry["cmd"] == "systemctl" and argv[:1] in (["is-enabled"], ["is-active"]):
            continue
        if entry["cmd"] in ("caddy", "sudo", "runuser") and argv[:1] in (["validate"], ["-v"], ["-u"]):
            continue
        found.append([entry["cmd"], *argv])
    return found


def host_calls_after_first_install(host: Host) -> list[list[str]]:
    return [argv[:4] for argv in host.calls("runuser")]


def placeholders(path: Path) -> list[str]:
    """@NAME@ placeholders left unfilled outside comments."""
    code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    return re.findall(r"@[A-Z_]+@", code)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def owner(host: Host, path: Path) -> str:
    """The owner the installer gave `path`: through the fake chown, or (root:root) the real one."""
    recorded = host.owners().get(str(path))
    return (
        recorded
        or subprocess.run(["stat", "-c", "%U:%G", str(path)], capture_output=True, text=True, check=True).stdout.strip()
    )


def unit_settings(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, _, value in (line.partition("=") for line in path.read_text().splitlines() if not line.startswith("#")):
        found.setdefault(key, []).append(value)
    return found


def with_environment_of(host: Host, installed: Host) -> Host:
    """`host`, still to be installed, given a copy of `installed`'s Python environment: the installer finds its
    dependencies up to date (its stamp names the same pyproject.toml and lock), so a first install there does every
    step but the download and build of the dependencies, which `installed`'s first install has tested."""
    venv = "opt/sandstorm-mcp/venv"
    shutil.copytree(installed.prefix / venv, host.prefix / venv, symlinks=True)
    return host


# --- fixtures the test modules import (each module gets its own: module scope) ------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed clone of the working tree, for the installer to install."""
    return make_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def installed(
    tmp_path_factory: pytest.TempPathFactory, repo: Path
) -> Iterator[tuple[Host, subprocess.CompletedProcess[str]]]:
    """A host after its first install, its server and executor running until the module's tests are done."""
    host = make_host(tmp_path_factory.mktemp("inst"), repo)
    try:
        yield host, host.install(SANDSTORM_ADMIN_PASSWORD="installer-test-password")
    finally:
        host.stop_server()
