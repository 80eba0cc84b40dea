"""deploy/install.sh's first install into a throwaway root (tests/deploy_host.py), what it installed and started, the
reruns that change little, and a first install whose Caddy fails (on a copy of the first install's Python
environment)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from oauth.claude_code import claude_code_line
from tests.deploy_host import (  # noqa: F401 (fixtures)
    AGENT,
    DOMAIN,
    Host,
    changes,
    commit,
    host_calls_after_first_install,
    installed,
    make_host,
    manifest,
    mode,
    owner,
    placeholders,
    repo,
    unit_settings,
    with_environment_of,
)

# The installer starts the installed units' server and executor for real (the production wiring, minus systemd): slow
# by nature. It runs without DATABASE_URL and installs on SQLite, so the PostgreSQL run leaves it out.
pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.same_on_any_database]


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


def test_an_operators_own_caddyfile_is_kept_and_extended_with_the_import(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    main = host.prefix / "etc/caddy/Caddyfile"
    options, site = "{\n\temail ops@example.org\n}\n", 'other.example.org {\n\trespond "hello"\n}\n'
    main.write_text(options + site)
    host.install()
    text = main.read_text()
    # Its global options get Caddy's admin socket (a move a reload cannot make: Caddy restarts, this once).
    admin = f"\tadmin unix/{host.prefix}/run/caddy/admin.sock\n"
    assert text.startswith("{\n") and admin in text.split("}\n", 1)[0] and "\temail ops@example.org\n" in text
    assert site in text and text.splitlines()[-1] == "import sandstorm-mcp.caddy"
    assert (host.prefix / "etc/caddy/Caddyfile.before-sandstorm").read_text() == options + site
    assert ["restart", "caddy.service"] in host.calls("systemctl")
    # A later change of the site alone is a reload, without a restart.
    site_file = host.prefix / "etc/caddy/sandstorm-mcp.caddy"
    site_file.write_text(site_file.read_text() + "# an operator's edit\n")
    host.install()  # (each run's calls are recorded anew)
    assert main.read_text() == text
    systemctl = host.calls("systemctl")
    assert ["reload", "caddy.service"] in systemctl and ["restart", "caddy.service"] not in systemctl
    assert ["restart", "sandstorm-mcp.service"] not in systemctl


def test_an_admin_address_agents_could_reach_is_refused_before_anything_changes(
    installed: tuple[Host, subprocess.CompletedProcess[str]],
) -> None:
    host, _ = installed
    main = host.prefix / "etc/caddy/Caddyfile"
    own = "{\n\tadmin localhost:2019\n}\nimport sandstorm-mcp.caddy\n"
    original = main.read_text()
    main.write_text(own)
    try:
        result = host.install(check=False)
        assert result.returncode != 0 and main.read_text() == own
        assert (
            f"{main}: it sets `admin localhost:2019`, which every local user (an agent too) may reach" in result.stderr
        )
        assert "nothing was changed" in result.stderr
        assert host.calls("systemctl") == [] and host.calls("apt-get") == []
    finally:
        main.write_text(original)


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
    short_tmp: Path, repo: Path, installed: tuple[Host, subprocess.CompletedProcess[str]]
) -> None:
    host = with_environment_of(make_host(short_tmp, repo), installed[0])
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


def test_caddy_failing_to_start_shows_its_journal_and_how_to_rerun(
    short_tmp: Path, repo: Path, installed: tuple[Host, subprocess.CompletedProcess[str]]
) -> None:
    host = with_environment_of(make_host(short_tmp, repo), installed[0])
    try:
        result = host.install(check=False, FAKE_CADDY_START_FAILS="1")
    finally:
        host.stop_server()
    assert result.returncode != 0
    assert "caddy.service failed to start. Its journal (journalctl -u caddy):" in result.stderr
    assert "listen tcp :443: bind: address already in use" in result.stderr
    assert f"then rerun: SANDSTORM_DOMAIN={DOMAIN} bash deploy/install.sh" in result.stderr
    assert "Sandstorm is running" not in result.stdout
