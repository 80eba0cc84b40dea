"""deploy/install.sh run for real into a throwaway root (SANDSTORM_PREFIX), with fakes for what only a real host has.

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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from oauth.claude_code import claude_code_line
from tests.live import REPO, poll

# The installer starts the installed units' server and executor for real (the production wiring, minus systemd).
# The installer runs without DATABASE_URL (`env` below) and installs on SQLite, so the PostgreSQL run leaves it out.
pytestmark = [pytest.mark.live, pytest.mark.same_on_any_database]

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


# --- the first install, shared by the tests that look at its result ----------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def installed(
    tmp_path_factory: pytest.TempPathFactory, repo: Path
) -> Iterator[tuple[Host, subprocess.CompletedProcess[str]]]:
    host = make_host(tmp_path_factory.mktemp("inst"), repo)
    try:
        yield host, host.install(SANDSTORM_ADMIN_PASSWORD="installer-test-password")
    finally:
        host.stop_server()


def test_first_install_migrates_creates_the_admin_and_prints_a_token_once(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, result = installed
    out = result.stdout
    assert "Sandstorm is ready." in out
    assert "Token:      sst_" in out and "shown once" in out
    token = re.findall(r"Token: +(sst_\S+)", out)[0]
    assert claude_code_line(f"https://{DOMAIN}/mcp", "<token>") in out, "the summary's line, with a placeholder"
    assert f"  {claude_code_line(f'https://{DOMAIN}/mcp', token)}\n" in out, "the banner's, with the token"
    assert "installer-test-password" not in out + result.stderr
    assert (host.prefix / "var/lib/sandstorm-mcp/sandstorm.sqlite3").exists()


def test_first_install_smoke_tests_the_server_through_caddy_and_as_caddys_user(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, result = installed
    for line in (
        f"{host.prefix}/run/sandstorm-mcp/worker-1.sock: caddy connects (200)",
        f"https://{DOMAIN}/health: 200, tools run by the executor as {AGENT}",
        "/mcp without a token: 401 with WWW-Authenticate",
        "/mcp initialize with a token: 200",
    ):
        assert line in result.stdout
    assert ["-u", "caddy", "--", "curl"] in host_calls_after_first_install(host)
    # Daphne's socket directory, by the tmpfiles rule: the server's user and Caddy's group only.
    assert mode(host.prefix / "run/sandstorm-mcp") == 0o750
    # The OAuth metadata is checked too (Claude.ai's connector needs it).
    assert "/.well-known/oauth-protected-resource/mcp: 200" in result.stdout


def host_calls_after_first_install(host: Host) -> list[list[str]]:
    return [argv[:4] for argv in host.calls("runuser")]


def test_first_install_prints_where_everything_is(installed: tuple[Host, subprocess.CompletedProcess[str]]) -> None:
    host, result = installed
    for expected in (
        f"Sandstorm is running at https://{DOMAIN}",
        f"URL https://{DOMAIN}/mcp",
        f"https://{DOMAIN}/admin/",
        f"Data:             {host.prefix}/var/lib/sandstorm-mcp",
        "git pull && SANDSTORM_DOMAIN=",
    ):
        assert expected in result.stdout


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


def test_files_owners_and_modes(installed: tuple[Host, subprocess.CompletedProcess[str]]) -> None:
    host, _ = installed
    p = host.prefix
    env_file = p / "etc/sandstorm-mcp.env"
    assert mode(env_file) == 0o600 and owner(host, env_file) == "root:root"
    assert env_file.read_text().count(f"SANDSTORM_PUBLIC_URL=https://{DOMAIN}\n") == 1
    state, agent_home = p / "var/lib/sandstorm-mcp", p / f"home/{AGENT}"
    assert mode(state) == 0o700 and owner(host, state) == "sandstorm:sandstorm"
    assert mode(state / "backups") == 0o700 and owner(host, state / "backups") == "sandstorm:sandstorm"
    assert mode(agent_home) == 0o750 and owner(host, agent_home) == f"{AGENT}:{AGENT}"
    # The agent's alone (no setgid, no group access): the server no longer works in it.
    assert mode(agent_home / "workspace") == 0o750 and owner(host, agent_home / "workspace") == f"{AGENT}:{AGENT}"
    assert f"SANDSTORM_WORKSPACE_ROOT={agent_home / 'workspace'}\n" in env_file.read_text()
    manage = p / "usr/local/bin/sandstorm-manage"
    assert mode(manage) == 0o755 and not placeholders(manage)
    units = p / "etc/systemd/system"
    for unit in ("sandstorm-mcp.service", "sandstorm-mcp-executor.service", "sandstorm-mcp-executor.socket"):
        assert mode(units / unit) == 0o644 and owner(host, units / unit) == "root:root"
    for job in ("backup", "cleartokens", "prune-clients", "prune-output", "audit-prune"):
        assert (units / f"sandstorm-mcp-{job}.service").exists() and (units / f"sandstorm-mcp-{job}.timer").exists()
    site = (p / "etc/caddy/sandstorm-mcp.caddy").read_text()
    assert (
        site.startswith("# Sandstorm")
        and f"\n{DOMAIN} {{\n" in site
        and f"unix/{p}/run/sandstorm-mcp/worker-1.sock" in site
    )
    assert (p / "etc/caddy/Caddyfile").read_text().splitlines()[-1] == "import sandstorm-mcp.caddy"
    assert not (p / "etc/sudoers.d/sandstorm-mcp").exists()
    # The code is the repository's HEAD, and the server cannot write it.
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=host.repo, capture_output=True, text=True).stdout
    assert (p / "opt/sandstorm-mcp/app/.sandstorm-revision").read_text() == revision
    assert owner(host, p / "opt/sandstorm-mcp") == owner(host, p / "opt/sandstorm-mcp/app/manage.py") == "root:root"
    assert not any(placeholders(unit) for unit in units.glob("sandstorm-mcp*") if unit.is_file())
    assert not placeholders(units / "sandstorm-mcp-executor.service.d/limits.conf")
    assert not placeholders(p / "etc/caddy/sandstorm-mcp.caddy")


def unit_settings(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, _, value in (line.partition("=") for line in path.read_text().splitlines() if not line.startswith("#")):
        found.setdefault(key, []).append(value)
    return found


def test_the_executor_unit_runs_tools_as_the_agent_on_the_servers_socket(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    p = host.prefix
    executor = unit_settings(p / "etc/systemd/system/sandstorm-mcp-executor.service")
    server = unit_settings(p / "etc/systemd/system/sandstorm-mcp.service")
    assert executor["User"] == [AGENT] and executor["Group"] == [AGENT] and server["User"] == ["sandstorm"]
    assert executor["ExecStart"] == [
        f"{p}/opt/sandstorm-mcp/venv/bin/python -m mcpserver.executor --workspace {p}/home/{AGENT}/workspace --allow-uid sandstorm"
    ]
    socket_unit = unit_settings(p / "etc/systemd/system/sandstorm-mcp-executor.socket")
    socket = f"{p}/run/sandstorm-mcp-executor/executor.sock"
    assert socket_unit["ListenStream"] == [socket] and socket_unit["SocketGroup"] == ["sandstorm"]
    assert f"SANDSTORM_EXECUTOR_SOCKET={socket}" in server["Environment"]
    assert f'EXECUTOR_SOCKET="{socket}"' in (p / "usr/local/bin/sandstorm-manage").read_text()
    for job in ("backup", "cleartokens", "prune-clients", "prune-output", "audit-prune"):
        assert (
            f"SANDSTORM_EXECUTOR_SOCKET={socket}"
            in unit_settings(p / f"etc/systemd/system/sandstorm-mcp-{job}.service")["Environment"]
        )
    assert executor["KillMode"] == ["process"] and "KillMode" not in server
    assert executor["InaccessiblePaths"] == [f"{p}/var/lib/sandstorm-mcp {p}/etc/sandstorm-mcp.env"]
    assert (
        executor["EnvironmentFile"] == [f"-{p}/etc/sandstorm-mcp-executor.env"]
        and not (p / "etc/sandstorm-mcp-executor.env").exists()
    )
    assert (
        executor["BindPaths"] == [f"{p}/home/{AGENT}"]
        and "BindPaths" not in server
        and "SupplementaryGroups" not in server
    )


def test_the_running_server_reaches_the_executor_running_as_the_agent(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, result = installed
    assert f"/health: 200, tools run by the executor as {AGENT}" in result.stdout
    health = subprocess.run(
        [
            "curl",
            "--silent",
            "--unix-socket",
            f"{host.prefix}/run/sandstorm-mcp/worker-1.sock",
            f"http://{DOMAIN}/health",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    executor = json.loads(health.stdout)["executor"]
    assert executor["ok"] is True and executor["mode"] == "service" and executor["user"] == AGENT
    # The server did not start an executor of its own ("service", not "child"): the one answering is the unit's.
    executor_pid, server_pid = host.pid("executor"), host.pid("server")
    assert executor_pid and server_pid
    assert "mcpserver.executor" in " ".join(psutil.Process(executor_pid).cmdline())
    assert not any(
        "mcpserver.executor" in " ".join(child.cmdline())
        for child in psutil.Process(server_pid).children(recursive=True)
    )


def test_first_install_creates_both_users_and_starts_everything(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    # The calls log was rewritten by later runs only if a test ran one first; the module runs this file in order.
    useradds = [argv[-1] for argv in host.calls("useradd")]
    assert useradds == ["sandstorm", AGENT]
    # The server user is not in the agent's group: it has no business in the agent's files.
    assert host.calls("usermod") == [] and host.calls("gpasswd") == []
    assert "sandstorm" not in host.groups()[AGENT]
    systemctl = host.calls("systemctl")
    # The executor's socket, then the executor, then the server, whose smoke test needs the executor.
    order = [
        ["start", "sandstorm-mcp-executor.socket"],
        ["start", "sandstorm-mcp-executor.service"],
        ["restart", "sandstorm-mcp.socket"],
        ["start", "sandstorm-mcp.service"],
    ]
    assert all(call in systemctl for call in order), systemctl
    assert [systemctl.index(call) for call in order] == sorted(systemctl.index(call) for call in order)
    for expected in (
        ["daemon-reload"],
        ["enable", "sandstorm-mcp-executor.socket"],
        ["enable", "sandstorm-mcp-executor.service"],
        ["enable", "sandstorm-mcp.service"],
        ["enable", "sandstorm-mcp.socket"],
        ["start", "sandstorm-mcp.service"],
        ["enable", "--now", "sandstorm-mcp-backup.timer"],
        ["enable", "--now", "sandstorm-mcp-cleartokens.timer"],
        ["enable", "--now", "sandstorm-mcp-prune-clients.timer"],
        ["enable", "--now", "sandstorm-mcp-prune-output.timer"],
        ["enable", "--now", "caddy.service"],
    ):
        assert expected in systemctl
    # Audit records are kept until the admin sets a retention.
    assert ["enable", "--now", "sandstorm-mcp-audit-prune.timer"] not in systemctl
    assert ["validate", "--adapter", "caddyfile", "--config", f"{host.prefix}/etc/caddy/Caddyfile"] in host.calls(
        "caddy"
    )


def test_a_second_run_changes_nothing(installed: tuple[Host, subprocess.CompletedProcess[str]]) -> None:
    host, _ = installed
    before = manifest(host.prefix)
    result = host.install()
    assert manifest(host.prefix) == before
    assert changes(host) == [], result.stdout
    assert "running, nothing to restart" in result.stdout
    assert "site unchanged" in result.stdout
    assert "Password:   " not in result.stdout.replace("Password:   the one printed on first run", "")
    assert "Token:      sst_" not in result.stdout
    assert "/mcp initialize with a token: 200" in result.stdout


def test_an_existing_env_file_is_kept_and_missing_variables_are_named(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    env_file = host.prefix / "etc/sandstorm-mcp.env"
    original = env_file.read_text()
    edited = original.replace("SANDSTORM_STATE_DIR=", "#SANDSTORM_STATE_DIR=") + "# edited by the operator\n"
    try:
        env_file.write_text(edited)
        env_file.chmod(0o644)
        result = host.install("--dry-run")
        assert env_file.read_text() == edited
        assert "does not set SANDSTORM_STATE_DIR, which this version needs" in result.stderr
        assert "had mode 644" in result.stderr
    finally:
        env_file.write_text(original)
        env_file.chmod(0o600)


def test_a_retention_turns_the_audit_prune_timer_on(installed: tuple[Host, subprocess.CompletedProcess[str]]) -> None:
    host, _ = installed
    env_file = host.prefix / "etc/sandstorm-mcp.env"
    original = env_file.read_text()
    try:
        env_file.write_text(original + "SANDSTORM_AUDIT_RETENTION_DAYS=400\n")
        host.install()
        assert ["enable", "--now", "sandstorm-mcp-audit-prune.timer"] in host.calls("systemctl")
    finally:
        env_file.write_text(original)
    host.install()
    assert ["disable", "--now", "sandstorm-mcp-audit-prune.timer"] in host.calls("systemctl")


def test_agent_sudo_adds_a_limited_rule_and_a_run_without_it_removes_it(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    units = host.prefix / "etc/systemd/system"
    sudoers, drop_in = (
        host.prefix / "etc/sudoers.d/sandstorm-mcp",
        units / "sandstorm-mcp-executor.service.d/agent-sudo.conf",
    )
    result = host.install("--agent-sudo")
    assert mode(sudoers) == 0o440 and owner(host, sudoers) == "root:root"
    rules = [line for line in sudoers.read_text().splitlines() if line and not line.startswith(("#", "Defaults"))]
    assert rules == [
        f"{AGENT} ALL=(root) NOPASSWD: /usr/bin/apt-get install -y -- *"
    ]  # the server's user runs no tools
    # On the executor's unit, where tools run; the server's keeps NoNewPrivileges.
    assert "NoNewPrivileges=no" in drop_in.read_text()
    assert not (units / "sandstorm-mcp.service.d").exists()
    assert "can take over this host" in result.stderr
    assert ["daemon-reload"] in host.calls("systemctl") and ["restart", "sandstorm-mcp-executor.service"] in host.calls(
        "systemctl"
    )
    result = host.install()
    assert not sudoers.exists() and not drop_in.exists()
    assert "removed the agents' sudo rule" in result.stderr
    assert ["restart", "sandstorm-mcp-executor.service"] in host.calls("systemctl")


def test_a_changed_socket_unit_restarts_the_socket_with_the_executor_down(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    socket_unit = host.prefix / "etc/systemd/system/sandstorm-mcp-executor.socket"
    socket_unit.write_text(socket_unit.read_text().replace("SocketMode=0660", "SocketMode=0666"))  # an older version
    result = host.install()
    assert "SocketMode=0660" in socket_unit.read_text()
    # systemd refuses to restart a socket its running service holds: the executor stops first, then starts again.
    systemctl = host.calls("systemctl")
    order = [
        ["stop", "sandstorm-mcp-executor.service"],
        ["restart", "sandstorm-mcp-executor.socket"],
        ["start", "sandstorm-mcp-executor.service"],
    ]
    assert all(call in systemctl for call in order), systemctl
    assert [systemctl.index(call) for call in order] == sorted(systemctl.index(call) for call in order)
    assert f"/health: 200, tools run by the executor as {AGENT}" in result.stdout


def test_an_operators_own_caddyfile_is_kept_and_extended_with_the_import(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    main = host.prefix / "etc/caddy/Caddyfile"
    own = 'other.example.org {\n\trespond "hello"\n}\n'
    main.write_text(own)
    host.install()
    assert main.read_text().startswith(own) and main.read_text().splitlines()[-1] == "import sandstorm-mcp.caddy"
    assert (host.prefix / "etc/caddy/Caddyfile.before-sandstorm").read_text() == own
    assert ["reload", "caddy.service"] in host.calls("systemctl")
    assert ["restart", "sandstorm-mcp.service"] not in host.calls("systemctl")


def test_a_rerun_after_a_new_commit_upgrades_code_and_schema_and_restarts(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    (host.repo / "UPGRADE-MARKER").write_text("new code\n")
    commit(host.repo, "a new version")
    result = host.install()
    app = host.prefix / "opt/sandstorm-mcp/app"
    assert (app / "UPGRADE-MARKER").read_text() == "new code\n"
    systemctl = host.calls("systemctl")
    # The server stops first (the executor ends its calls in flight), the executor starts first (the server needs it).
    order = [
        ["stop", "sandstorm-mcp.service"],
        ["stop", "sandstorm-mcp-executor.service"],
        ["start", "sandstorm-mcp-executor.service"],
        ["start", "sandstorm-mcp.service"],
    ]
    assert [systemctl.index(call) for call in order] == sorted(systemctl.index(call) for call in order)
    assert "dependencies up to date" in result.stdout  # pyproject.toml and the lock did not change
    assert "/mcp initialize with a token: 200" in result.stdout
    assert (host.prefix / "var/lib/sandstorm-mcp/sandstorm.sqlite3").exists()


# --- dry run and refusals ----------------------------------------------------------------------------------------


def test_dry_run_on_a_fresh_host_writes_nothing_and_says_what_it_would_do(tmp_path: Path, repo: Path) -> None:
    host = make_host(tmp_path, repo)
    before = manifest(host.prefix)
    result = host.install("--dry-run")
    assert manifest(host.prefix) == before
    assert changes(host) == []
    out = result.stdout
    assert "would run: useradd --system" in out
    assert f"would create {host.prefix}/etc/sandstorm-mcp.env" in out
    assert "would run: systemctl start sandstorm-mcp-executor.service" in out
    assert "would run: systemctl start sandstorm-mcp.service" in out
    assert f"would create {host.prefix}/etc/systemd/system/sandstorm-mcp-executor.service" in out
    assert "gpasswd" not in out and "usermod" not in out
    assert "Dry run: nothing was changed" in out


def test_missing_packages_are_installed_from_the_distribution(tmp_path: Path, repo: Path) -> None:
    host = make_host(tmp_path, repo)
    result = host.install("--dry-run", FAKE_MISSING_PACKAGES="caddy python3-venv")
    assert "would run: apt-get update -qq" in result.stdout
    assert (
        "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv caddy"
        in result.stdout
    )


@pytest.mark.parametrize(
    ("os_release", "shown"),
    [
        (
            'PRETTY_NAME="Debian GNU/Linux 11 (bullseye)"\nVERSION_ID="11"\nID=debian\n',
            "Debian GNU/Linux 11 (bullseye)",
        ),
        ('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nVERSION_ID="22.04"\nID=ubuntu\n', "Ubuntu 22.04.4 LTS"),
        ('PRETTY_NAME="Fedora Linux 40"\nVERSION_ID=40\nID=fedora\n', "Fedora Linux 40"),
    ],
)
def test_an_unsupported_system_is_refused(tmp_path: Path, repo: Path, os_release: str, shown: str) -> None:
    host = make_host(tmp_path, repo, os_release)
    result = host.install("--dry-run", check=False)
    assert result.returncode == 1
    assert (
        f"unsupported system: {shown}. This installer supports Debian 12 and 13 and Ubuntu 24.04 or newer."
        in result.stderr
    )
    assert changes(host) == []


@pytest.mark.parametrize(
    "os_release",
    [
        'PRETTY_NAME="Ubuntu 24.04 LTS"\nVERSION_ID="24.04"\nID=ubuntu\n',
        'PRETTY_NAME="Debian 13"\nVERSION_ID="13"\nID=debian\n',
    ],
)
def test_supported_systems_pass_the_check(tmp_path: Path, repo: Path, os_release: str) -> None:
    host = make_host(tmp_path, repo, os_release)
    assert host.install("--dry-run").returncode == 0


@pytest.mark.parametrize(
    ("domain", "message"), [(None, "SANDSTORM_DOMAIN is not set"), ("https://mcp.example.com/", "must be a DNS name")]
)
def test_a_missing_or_bad_domain_is_refused(tmp_path: Path, repo: Path, domain: str | None, message: str) -> None:
    host = make_host(tmp_path, repo)
    result = host.install(check=False, SANDSTORM_DOMAIN=domain)
    assert result.returncode == 1 and message in result.stderr
    assert changes(host) == [] and not (host.prefix / "etc/sandstorm-mcp.env").exists()


def test_a_user_without_sudo_is_refused(tmp_path: Path, repo: Path) -> None:
    host = make_host(tmp_path, repo)
    result = host.install(check=False, FAKE_UID="1000", FAKE_SUDO="no")
    assert result.returncode == 1
    assert "needs root privileges: run it as a user who may use sudo (or as root)" in result.stderr
    assert changes(host) == []


def test_a_user_with_sudo_runs_the_privileged_steps_through_it(tmp_path: Path, repo: Path) -> None:
    host = make_host(tmp_path, repo)
    result = host.install("--dry-run", FAKE_UID="1000", FAKE_SUDO="ok")
    assert ["-v"] in host.calls("sudo")
    assert any(argv[:2] == ["--", "test"] for argv in host.calls("sudo"))
    assert "Dry run: nothing was changed" in result.stdout


# --- the smoke test goes through Caddy; nothing is announced before it passed -----------------------------------


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A root short enough for the sockets' paths under it (108 bytes at most), which a test's tmp_path is not."""
    root = Path(tempfile.mkdtemp(prefix="inst", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_first_install_whose_caddy_does_not_answer_fails_without_announcing_its_secrets(
    short_tmp: Path, repo: Path
) -> None:
    host = make_host(short_tmp, repo)
    try:
        result = host.install(check=False, FAKE_CADDY_DOWN="1", SANDSTORM_HTTPS_WAIT="2")
    finally:
        host.stop_server()
    assert result.returncode != 0
    assert f"https://{DOMAIN}/health through Caddy answered" in result.stderr and "journalctl -u caddy" in result.stderr
    assert "Sandstorm is running" not in result.stdout and "Sandstorm is ready" not in result.stdout
    assert "sst_" not in result.stdout + result.stderr
    # The first secrets are not lost: they wait in a file of the admin's alone, named in the last line.
    named = re.search(r"are in (\S+) \(yours alone\)", result.stderr)
    assert named, result.stderr
    kept = Path(named.group(1))
    try:
        assert mode(kept) == 0o600 and "Token:      sst_" in kept.read_text()
    finally:
        kept.unlink()


def test_caddy_failing_to_start_shows_its_journal_and_how_to_rerun(short_tmp: Path, repo: Path) -> None:
    host = make_host(short_tmp, repo)
    try:
        result = host.install(check=False, FAKE_CADDY_START_FAILS="1")
    finally:
        host.stop_server()
    assert result.returncode != 0
    assert "caddy.service failed to start. Its journal (journalctl -u caddy):" in result.stderr
    assert "listen tcp :443: bind: address already in use" in result.stderr
    assert f"then rerun: SANDSTORM_DOMAIN={DOMAIN} bash deploy/install.sh" in result.stderr
    assert "Sandstorm is running" not in result.stdout


# --- the executor's resource limits ------------------------------------------------------------------------------


def test_the_executor_limits_come_from_the_env_file_and_a_change_restarts_the_executor(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    drop_in = host.prefix / "etc/systemd/system/sandstorm-mcp-executor.service.d/limits.conf"
    env_file = host.prefix / "etc/sandstorm-mcp.env"
    original = env_file.read_text()
    assert {"TasksMax=4096", "MemoryHigh=75%", "MemoryMax=85%"} <= set(drop_in.read_text().splitlines())
    try:
        env_file.write_text(original + "SANDSTORM_EXECUTOR_TASKS_MAX=512\nSANDSTORM_EXECUTOR_MEMORY_MAX=2G\n")
        host.install()
        assert {"TasksMax=512", "MemoryHigh=75%", "MemoryMax=2G"} <= set(drop_in.read_text().splitlines())
        systemctl = host.calls("systemctl")
        assert ["daemon-reload"] in systemctl and ["restart", "sandstorm-mcp-executor.service"] in systemctl
        # A value systemd would not take is refused before anything changes.
        env_file.write_text(original + "SANDSTORM_EXECUTOR_MEMORY_MAX=lots\n")
        before = manifest(host.prefix)
        result = host.install(check=False)
        assert result.returncode != 0 and "SANDSTORM_EXECUTOR_MEMORY_MAX" in result.stderr and "'lots'" in result.stderr
        assert manifest(host.prefix) == before and changes(host) == []
    finally:
        env_file.write_text(original)
    host.install()
    assert "TasksMax=4096" in drop_in.read_text().splitlines()
