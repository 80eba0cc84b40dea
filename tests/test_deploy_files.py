"""The deploy/ files checked by the tools that run them: shellcheck, systemd-analyze verify, caddy validate/adapt."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.live import REPO

DEPLOY = REPO / "deploy"
SYSTEMD_TEST = REPO / "tests" / "systemd"
SHELL_SCRIPTS = [
    DEPLOY / "install.sh",
    DEPLOY / "sandstorm-manage",
    REPO / ".ci" / "run",
    SYSTEMD_TEST / "run.sh",
    SYSTEMD_TEST / "checks.sh",
]
SERVER_UNIT, EXECUTOR_UNIT = DEPLOY / "sandstorm-mcp.service", DEPLOY / "sandstorm-mcp-executor.service"
EXECUTOR_SOCKET_UNIT = DEPLOY / "sandstorm-mcp-executor.socket"
SERVER_SOCKET_UNIT = DEPLOY / "sandstorm-mcp.socket"
MAINTENANCE_UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
UNIT_TEMPLATES = [
    SERVER_UNIT,
    SERVER_SOCKET_UNIT,
    EXECUTOR_UNIT,
    EXECUTOR_SOCKET_UNIT,
    DEPLOY / "sandstorm-mcp-redis.service",
    *MAINTENANCE_UNITS,
    *sorted((DEPLOY / "systemd").glob("*.timer")),
]
EXECUTOR_SOCKET = "@EXECUTOR_RUN_DIR@/executor.sock"
LONGEST_TOOL_TIMEOUT_S = 300  # terminal_exec's upper bound


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed (.ci/run installs it from the distribution)")
    return path


def render(template: Path, values: dict[str, str]) -> str:
    """The installer's rendering: every @NAME@ replaced by its value."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    assert not re.findall(
        r"@[A-Z_]+@", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    ), template
    return text


def test_every_shell_script_is_shellcheck_clean() -> None:
    scripts = [
        *SHELL_SCRIPTS,
        SYSTEMD_TEST / "rootfs.sh",
        *(
            p
            for p in DEPLOY.rglob("*")
            if p.is_file() and p.read_text(errors="replace").startswith("#!/usr/bin/env bash")
        ),
    ]
    result = subprocess.run(
        [need("shellcheck"), "--shell=bash", "--severity=style", *sorted(set(scripts))], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_shell_script_is_strict() -> None:
    for script in SHELL_SCRIPTS:
        assert "\nset -euo pipefail\n" in script.read_text(), script


# --- systemd -------------------------------------------------------------------------------------------------------

# systemd-analyze verify, run in a container without systemd as PID 1, can print lines about the machine rather
# than the units; only these are ignored (each is about the environment, none about a unit's content).
ENVIRONMENTAL = (
    re.compile(r"^System has not been booted with systemd"),
    re.compile(r"^Failed to (connect to|open) (bus|system bus)"),
    re.compile(r"^Failed to prepare filename"),  # unit names outside the unit path in old versions
)


def rendered_units(tmp_path: Path) -> Path:
    """The unit templates rendered with paths that exist here: this repository, this virtualenv, temporary dirs."""
    for name in ("state", "home/agent/workspace", "run", "run-executor"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "sandstorm-mcp.env").write_text("SANDSTORM_PUBLIC_URL=https://mcp.example.com\n")
    values = {
        "APP_DIR": str(REPO),
        "VENV": str(Path(sys.executable).parent.parent),
        "STATE_DIR": str(tmp_path / "state"),
        "ENV_FILE": str(tmp_path / "sandstorm-mcp.env"),
        "RUN_DIR": str(tmp_path / "run"),
        "EXECUTOR_RUN_DIR": str(tmp_path / "run-executor"),
        "EXECUTOR_ENV_FILE": str(tmp_path / "sandstorm-mcp-executor.env"),
        "WORKSPACE": str(tmp_path / "home/agent/workspace"),
        "SERVICE_USER": "sandstorm",
        "AGENT_USER": "sandstorm-agent",
        "AGENT_HOME": str(tmp_path / "home/agent"),
        "CADDY_GROUP": "caddy",
        "TASKS_MAX": "4096",
        "MEMORY_HIGH": "75%",
        "MEMORY_MAX": "85%",
        "WORKER": "1",
        "WORKERS": "1",
        "SOCKET_UNIT": "sandstorm-mcp.socket",
        "REDIS_URL": "",
        "REDIS_RUN_DIR": str(tmp_path / "run-redis"),
    }
    units = tmp_path / "units"
    units.mkdir()
    for template in UNIT_TEMPLATES:
        (units / template.name).write_text(render(template, values))
    # The agent-sudo drop-in, verified as systemd would apply it: appended to the unit it extends (the executor's).
    with_drop_in = render(EXECUTOR_UNIT, values) + render(DEPLOY / "systemd" / "agent-sudo.conf", values)
    (units / "sandstorm-mcp-executor-with-agent-sudo.service").write_text(with_drop_in)
    with_limits = render(EXECUTOR_UNIT, values) + render(DEPLOY / "systemd" / "executor-limits.conf", values)
    (units / "sandstorm-mcp-executor-with-limits.service").write_text(with_limits)
    return units


REDIS_UNIT = "sandstorm-mcp-redis.service"


def verify(units: Path, files: list[str]) -> None:
    """systemd-analyze verify on these unit files: no complaint but the environment's (no systemd booted here)."""
    result = subprocess.run(
        [need("systemd-analyze"), "verify", "--man=no", *files], cwd=units, capture_output=True, text=True
    )
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line and not any(p.search(line) for p in ENVIRONMENTAL)
    ]
    assert result.returncode == 0 and complaints == [], "\n".join(complaints)


def test_systemd_analyze_verifies_every_unit(tmp_path: Path) -> None:
    units = rendered_units(tmp_path)
    verify(units, sorted(str(path) for path in units.iterdir() if path.name != REDIS_UNIT))


def test_systemd_analyze_verifies_the_redis_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: Debian's redis-server, which .ci/run installs.
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here (apt install redis-server), and verify needs its ExecStart")
    units = rendered_units(tmp_path)
    verify(units, [str(units / REDIS_UNIT)])


def directives(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


LEFT_OUT_FOR_AGENTS = (
    "MemoryDenyWriteExecute",
    "SystemCallFilter",
    "RestrictNamespaces",
    "PrivateDevices",
    "CapabilityBoundingSet",
    "UMask",
)


def test_the_service_serves_the_socket_systemd_holds_where_caddy_proxies() -> None:
    """Who may connect is proven under a real systemd (tests/systemd/); here, that the files agree on the socket."""
    unit = directives(SERVER_UNIT)
    assert unit["ExecStart"] == ["@VENV@/bin/python @APP_DIR@/manage.py serve --systemd-socket"]
    assert unit["Requires"] == ["@SOCKET_UNIT@"] and "@SOCKET_UNIT@" in unit["After"]
    # systemd re-owns a RuntimeDirectory= to the unit's user and group at every start: it must not hold the socket.
    assert not any(key.startswith("RuntimeDirectory") for key in unit) and "ExecStartPre" not in unit
    socket = directives(SERVER_SOCKET_UNIT)
    assert socket["ListenStream"] == ["@RUN_DIR@/worker-@WORKER@.sock"] and socket["WantedBy"] == ["sockets.target"]
    site = (DEPLOY / "Caddyfile").read_text()
    assert "reverse_proxy @UPSTREAMS@ {" in site and "reverse_proxy unix/@RUN_DIR@/worker-{re.worker.1}.sock {" in site
    rule = (DEPLOY / "systemd" / "tmpfiles.conf").read_text().splitlines()
    assert [line for line in rule if line and not line.startswith("#")] == [
        "d @RUN_DIR@ 0750 @SERVICE_USER@ @CADDY_GROUP@ -"
    ]
    assert unit["User"] == ["@SERVICE_USER@"] and unit["EnvironmentFile"] == ["@ENV_FILE@"]
    assert unit["Restart"] == ["on-failure"] and unit["KillSignal"] == ["SIGTERM"]
    for setting in ("NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectSystem=full", "ProtectHome=yes", "UMask=0077"):
        key, _, value = setting.partition("=")
        assert unit[key] == [value]


def test_the_server_is_not_restarted_after_the_start_up_check_refused_its_database() -> None:
    """A refusal (mcpserver.start_check) is one line in the journal; restarting every 2 s would bury it."""
    from mcpserver.start_check import EXIT_REFUSED

    assert directives(SERVER_UNIT)["RestartPreventExitStatus"] == [str(EXIT_REFUSED)]


def test_the_server_reaches_tools_only_through_the_executor_socket() -> None:
    unit = directives(SERVER_UNIT)
    assert f"SANDSTORM_EXECUTOR_SOCKET={EXECUTOR_SOCKET}" in unit["Environment"]
    # Wanted and ordered after, never required: with the executor down the server stays up and /health says so.
    assert "sandstorm-mcp-executor.service" in unit["Wants"] and "sandstorm-mcp-executor.service" in unit["After"]
    assert "sandstorm-mcp-executor.service" not in unit.get("Requires", []) and "BindsTo" not in unit
    # Nothing of the agent's: no group, no home, no workspace; and no agent processes in its cgroup to spare.
    assert "SupplementaryGroups" not in unit and "BindPaths" not in unit and "KillMode" not in unit
    assert "@AGENT_USER@" not in SERVER_UNIT.read_text() and "@AGENT_HOME@" not in SERVER_UNIT.read_text()


def test_the_executor_runs_tools_as_the_agent_user_for_the_server_only() -> None:
    unit = directives(EXECUTOR_UNIT)
    assert unit["User"] == ["@AGENT_USER@"] and unit["Group"] == ["@AGENT_USER@"]
    assert unit["WorkingDirectory"] == ["@APP_DIR@"]
    # Its socket comes from systemd (socket activation), so it names none.
    assert unit["ExecStart"] == [
        "@VENV@/bin/python -m mcpserver.executor --workspace @WORKSPACE@ --allow-uid @SERVICE_USER@"
    ]
    assert unit["Requires"] == ["sandstorm-mcp-executor.socket"] and "sandstorm-mcp-executor.socket" in unit["After"]
    # No directory of its own in /run: one owned by the agent user would let the agent replace the socket.
    assert not any(key.startswith("RuntimeDirectory") for key in unit)
    assert unit["Restart"] == ["always"] and unit["KillSignal"] == ["SIGTERM"]
    # Background processes live in this unit's cgroup and must outlive its restarts.
    assert unit["KillMode"] == ["process"]
    # Never the server's secrets: not its env file, and its state dir and env file are not even there.
    assert unit["EnvironmentFile"] == ["-@EXECUTOR_ENV_FILE@"]
    assert unit["InaccessiblePaths"] == ["@STATE_DIR@ @ENV_FILE@"]
    assert "ReadWritePaths" not in unit and "SupplementaryGroups" not in unit
    for setting in (
        "NoNewPrivileges=yes",
        "ProtectHome=tmpfs",
        "BindPaths=@AGENT_HOME@",
        "ProtectProc=invisible",
    ):
        key, _, value = setting.partition("=")
        assert unit[key] == [value]
    assert unit["WantedBy"] == ["multi-user.target"]
    text = EXECUTOR_UNIT.read_text()
    for left_out in LEFT_OUT_FOR_AGENTS:
        assert re.search(rf"^# - {left_out}\b.*: ", text, re.MULTILINE), f"no comment says why {left_out} is left out"
        assert left_out not in unit


def test_agents_write_only_their_home_and_temporary_directories_of_the_executors_own() -> None:
    """What the kernel then enforces is proven under a real systemd (tests/systemd/, agent_writes_only_workspace)."""
    unit = directives(EXECUTOR_UNIT)
    # Everything read-only but the home (BindPaths=, writable) and what systemd mounts for the unit alone.
    assert unit["ProtectSystem"] == ["strict"] and unit["BindPaths"] == ["@AGENT_HOME@"]
    assert unit["PrivateTmp"] == ["yes"] and unit["ReadOnlyPaths"] == ["/var/tmp /run/lock"]
    assert unit["TemporaryFileSystem"] == ["/dev/shm:mode=1777,nosuid,nodev"]
    # The executor's own directory outside the workspace, kept across restarts, the agent user's alone.
    assert unit["StateDirectory"] == ["sandstorm-mcp-executor"] and unit["StateDirectoryMode"] == ["0700"]


def test_the_executor_socket_is_systemds_and_only_the_server_user_may_connect() -> None:
    socket = directives(EXECUTOR_SOCKET_UNIT)
    assert socket["ListenStream"] == [EXECUTOR_SOCKET]
    # The file and its directory are root's: the agent user (whose commands the executor runs) cannot replace it.
    assert socket["SocketUser"] == ["root"] and socket["DirectoryMode"] == ["0755"]
    # Only the server's group may connect; the executor's SO_PEERCRED check comes on top.
    assert socket["SocketGroup"] == ["@SERVICE_USER@"] and socket["SocketMode"] == ["0660"]
    assert "Accept" not in socket  # one executor for every connection
    assert socket["WantedBy"] == ["sockets.target"]


def test_the_executor_socket_is_the_same_everywhere() -> None:
    """The server, every maintenance job and sandstorm-manage point at the socket the executor listens on."""
    listening = directives(EXECUTOR_SOCKET_UNIT)["ListenStream"][0]
    assert listening == EXECUTOR_SOCKET
    for unit in (SERVER_UNIT, *MAINTENANCE_UNITS):
        assert f"SANDSTORM_EXECUTOR_SOCKET={listening}" in directives(unit).get("Environment", []), unit
    manage = (DEPLOY / "sandstorm-manage").read_text()
    assert (
        f'EXECUTOR_SOCKET="{listening}"' in manage and 'export SANDSTORM_EXECUTOR_SOCKET="$EXECUTOR_SOCKET"' in manage
    )


def test_maintenance_jobs_run_as_the_server_user_without_the_agents_files() -> None:
    for path in MAINTENANCE_UNITS:
        unit = directives(path)
        assert unit["User"] == ["@SERVICE_USER@"] and unit["UMask"] == ["0077"], path
        assert unit["ProtectHome"] == ["yes"] and "SupplementaryGroups" not in unit, path
        assert "@AGENT_HOME@" not in path.read_text() and "@AGENT_USER@" not in path.read_text(), path
    # prune_output asks the executor, so the job wants it running.
    prune = directives(DEPLOY / "systemd" / "sandstorm-mcp-prune-output.service")
    assert prune["Wants"] == ["sandstorm-mcp-executor.service"] and prune["After"] == ["sandstorm-mcp-executor.service"]


def test_the_agent_sudo_drop_in_relaxes_only_what_sudo_needs() -> None:
    drop_in = directives(DEPLOY / "systemd" / "agent-sudo.conf")
    assert drop_in == {"NoNewPrivileges": ["no"], "RestrictSUIDSGID": ["no"], "ProtectSystem": ["no"]}
    assert (
        "/etc/systemd/system/sandstorm-mcp-executor.service.d/agent-sudo.conf"
        in (DEPLOY / "systemd" / "agent-sudo.conf").read_text()
    )


def test_timers_cover_the_maintenance_jobs() -> None:
    commands = {path.stem: directives(path)["ExecStart"][0] for path in (DEPLOY / "systemd").glob("*.service")}
    assert commands["sandstorm-mcp-cleartokens"].endswith("manage.py cleartokens")
    assert commands["sandstorm-mcp-prune-clients"].endswith("manage.py prune_clients")
    assert commands["sandstorm-mcp-prune-output"].endswith("manage.py prune_output")
    assert "manage.py backup --force @STATE_DIR@/backups/" in commands["sandstorm-mcp-backup"]
    assert "audit_prune --yes --before" in commands["sandstorm-mcp-audit-prune"]
    for timer in (DEPLOY / "systemd").glob("*.timer"):
        assert directives(timer)["Persistent"] == ["true"], timer


def test_the_sudoers_rule_allows_only_the_package_manager() -> None:
    rules = [
        line
        for line in (DEPLOY / "sudoers.agent-sudo").read_text().splitlines()
        if line and not line.startswith(("#", "Defaults"))
    ]
    # The agent user's alone: the server's user runs no tools.
    assert rules == ["@AGENT_USER@ ALL=(root) NOPASSWD: /usr/bin/apt-get install -y -- *"]


# --- Caddy ---------------------------------------------------------------------------------------------------------


def caddy_workers(run_dir: str, workers: int) -> dict[str, str]:
    """The installer's values for the workers' part of the site (deploy/install.sh, render_caddy_site)."""
    numbers = range(1, workers + 1)
    return {
        "RUN_DIR": run_dir,
        "WORKER_NUMBERS": "|".join(str(number) for number in numbers),
        "UPSTREAMS": " ".join(f"unix/{run_dir}/worker-{number}.sock" for number in numbers),
    }


def rendered_caddyfile(
    tmp_path: Path,
    site: str = "mcp.example.com",
    max_bytes: str = "4194304",
    run_dir: str = "/run/sandstorm-mcp",
    workers: int = 1,
) -> Path:
    path = tmp_path / "Caddyfile"
    values = {"SITE_ADDRESS": site, "MAX_REQUEST_BYTES": max_bytes, **caddy_workers(run_dir, workers)}
    path.write_text(render(DEPLOY / "Caddyfile", values))
    return path


def caddy_env(tmp_path: Path) -> dict[str, str]:
    # Caddy keeps its data (certificates, autosave) under HOME/XDG dirs: keep them in the test's directory.
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


def test_caddy_validates_the_site_with_a_sample_domain(tmp_path: Path) -> None:
    caddyfile = rendered_caddyfile(tmp_path)
    result = subprocess.run(
        [need("caddy"), "validate", "--adapter", "caddyfile", "--config", str(caddyfile)],
        capture_output=True,
        text=True,
        env=caddy_env(tmp_path),
    )
    assert result.returncode == 0 and "Valid configuration" in result.stdout + result.stderr, result.stderr
    fmt = subprocess.run(
        [need("caddy"), "fmt", str(caddyfile)], capture_output=True, text=True, env=caddy_env(tmp_path)
    )
    assert fmt.stdout == caddyfile.read_text(), "deploy/Caddyfile is not in `caddy fmt` form"


def adapted(tmp_path: Path) -> dict[str, Any]:  # caddy's JSON config
    result = subprocess.run(
        [need("caddy"), "adapt", "--adapter", "caddyfile", "--config", str(rendered_caddyfile(tmp_path))],
        capture_output=True,
        text=True,
        env=caddy_env(tmp_path),
        check=True,
    )
    return json.loads(result.stdout)


def handlers(config: dict[str, object]) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "handler" in node:
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config["apps"])
    return found


def test_the_proxy_streams_waits_out_the_longest_tool_and_limits_bodies(tmp_path: Path) -> None:
    config = adapted(tmp_path)
    by_kind = {h["handler"]: h for h in handlers(config)}
    proxies = [handler for handler in handlers(config) if handler["handler"] == "reverse_proxy"]
    # Sessions to the worker named in their id; everything else over all workers (here the one).
    assert [proxy["upstreams"] for proxy in proxies] == [
        [{"dial": "unix//run/sandstorm-mcp/worker-{http.regexp.worker.1}.sock"}],
        [{"dial": "unix//run/sandstorm-mcp/worker-1.sock"}],
    ]
    for proxy in proxies:
        assert proxy["flush_interval"] == -1
        transport = proxy["transport"]
        assert isinstance(transport, dict)
        for timeout in ("read_timeout", "write_timeout"):
            assert transport[timeout] > LONGEST_TOOL_TIMEOUT_S * 1_000_000_000
        assert "headers" not in proxy  # nothing added or removed: Mcp-Session-Id, Mcp-Protocol-Version pass as sent
    assert by_kind["request_body"]["max_size"] == 4194304
    assert "encode" not in by_kind  # compression would buffer event streams
    security = by_kind["headers"]["response"]
    assert isinstance(security, dict)
    assert {"Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options"} <= set(security["set"])
    assert not any("mcp" in str(name).lower() for name in security.get("delete", []))


def test_the_access_log_is_json_without_query_strings_or_credentials(tmp_path: Path) -> None:
    config = adapted(tmp_path)
    logs = config["logging"]["logs"]
    access = next(log for name, log in logs.items() if name != "default")
    encoder = access["encoder"]
    assert encoder["format"] == "filter" and encoder["wrap"]["format"] == "json"
    fields = encoder["fields"]
    assert fields["request>uri"] == {"filter": "regexp", "regexp": "\\?.*$"}
    assert fields["request>headers>Authorization"] == {"filter": "delete"}
    assert fields["request>headers>Cookie"] == {"filter": "delete"}


# --- Caddy's admin API: on a socket only Caddy and root reach (deploy/caddy_admin.py) ------------------------------

ADMIN_SOCKET = "/run/caddy/admin.sock"


def caddy_admin(action: str, caddyfile: Path) -> subprocess.CompletedProcess[str]:
    """deploy/caddy_admin.py as the installer runs it (the host's python; here this one)."""
    command = [sys.executable, str(DEPLOY / "caddy_admin.py"), action, str(caddyfile), ADMIN_SOCKET]
    return subprocess.run(command, capture_output=True, text=True)


def admin_of(tmp_path: Path, text: str) -> dict[str, Any]:
    """The main Caddyfile TEXT, importing the rendered site, as Caddy reads it: its JSON config."""
    rendered_caddyfile(tmp_path).rename(tmp_path / "sandstorm-mcp.caddy")
    main = tmp_path / "main.caddy"
    main.write_text(text)
    result = subprocess.run(
        [need("caddy"), "adapt", "--adapter", "caddyfile", "--config", str(main)],
        capture_output=True,
        text=True,
        env=caddy_env(tmp_path),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def applied(tmp_path: Path, text: str) -> str:
    main = tmp_path / "Caddyfile.in"
    main.write_text(text)
    result = caddy_admin("apply", main)
    assert result.returncode == 0 and caddy_admin("check", main).returncode == 0, result.stderr
    main.write_text(result.stdout)
    assert caddy_admin("apply", main).returncode == 1, "a second run changes nothing"
    return result.stdout


IMPORT = "import sandstorm-mcp.caddy\n"
INSTALLER_WRITTEN = "# Written by Sandstorm's deploy/install.sh.\n" + IMPORT
OPERATORS_OPTIONS = "# mine\n{\n\tdebug\n}\n\n" + IMPORT
OPERATORS_SITE_FIRST = 'x.example.org {\n\trespond "x"\n}\n' + IMPORT


@pytest.mark.parametrize("before", [INSTALLER_WRITTEN, OPERATORS_OPTIONS, OPERATORS_SITE_FIRST, IMPORT])
def test_caddys_admin_api_moves_from_port_2019_to_the_socket(tmp_path: Path, before: str) -> None:
    assert "admin" not in admin_of(tmp_path, before), "the default: localhost:2019"
    after = applied(tmp_path, before)
    config = admin_of(tmp_path, after)
    assert config["admin"] == {"listen": f"unix/{ADMIN_SOCKET}"}
    assert handlers(config), "the site is still served"
    if before == OPERATORS_OPTIONS:  # the operator's own options and comments kept, in their block
        assert config["logging"]["logs"]["default"]["level"] == "DEBUG" and after.startswith("# mine\n{\n")


@pytest.mark.parametrize("admin", ["localhost:2019", "0.0.0.0:2019", "unix//tmp/caddy.sock", ""])
def test_an_admin_address_agents_could_reach_is_refused_and_left_unchanged(tmp_path: Path, admin: str) -> None:
    main = tmp_path / "Caddyfile"
    text = f"{{\n\tadmin {admin}\n}}\nimport sandstorm-mcp.caddy\n"
    main.write_text(text)
    for action in ("check", "apply"):
        result = caddy_admin(action, main)
        assert result.returncode == 3 and result.stdout == "", result
        assert f"{main}: it sets `admin {admin}`" in result.stderr
        assert f"replace it with `admin unix/{ADMIN_SOCKET}` (or `admin off`)" in result.stderr
    assert main.read_text() == text


def test_admin_off_is_left_alone(tmp_path: Path) -> None:
    main = tmp_path / "Caddyfile"
    main.write_text("{\n\tadmin off\n}\n")
    assert caddy_admin("apply", main).returncode == 1 and caddy_admin("check", main).returncode == 0


def test_caddys_drop_in_makes_the_sockets_directory_caddys_alone() -> None:
    drop_in = directives(DEPLOY / "systemd" / "caddy-admin.conf")
    assert drop_in == {"RuntimeDirectory": ["caddy"], "RuntimeDirectoryMode": ["0700"]}
    install = (DEPLOY / "install.sh").read_text()
    assert 'CADDY_ADMIN_SOCKET="$PREFIX/run/caddy/admin.sock"' in install
    assert 'CADDY_DROP_IN="$UNIT_DIR/caddy.service.d/$SERVICE.conf"' in install


def test_env_example_lists_every_variable_the_settings_read() -> None:
    settings = (REPO / "sandstorm_site" / "settings.py").read_text()
    read = set(re.findall(r'"((?:SANDSTORM_[A-Z_]+)|DATABASE_URL)"', settings))
    listed = set(
        re.findall(r"^#?((?:SANDSTORM_[A-Z_]+)|DATABASE_URL)=", (DEPLOY / "env.example").read_text(), re.MULTILINE)
    )
    assert read and read <= listed, f"not in deploy/env.example: {sorted(read - listed)}"


def test_env_example_lists_each_variable_once() -> None:
    names = re.findall(r"^#?((?:SANDSTORM_[A-Z_]+)|DATABASE_URL)=", (DEPLOY / "env.example").read_text(), re.MULTILINE)
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def audit_prune_command(tmp_path: Path) -> list[str]:
    """The audit-prune unit's ExecStart as systemd runs it ($$ and %% unescaped), with a python that only records."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >{tmp_path / "ran"}\n')
    python.chmod(0o755)
    line = directives(DEPLOY / "systemd" / "sandstorm-mcp-audit-prune.service")["ExecStart"][0]
    line = (
        line.replace("@VENV@", str(venv))
        .replace("@APP_DIR@", str(REPO))
        .replace("@ENV_FILE@", "/etc/sandstorm-mcp.env")
    )
    assert line.startswith("/bin/sh -c '") and line.endswith("'")
    return ["/bin/sh", "-c", line[len("/bin/sh -c '") : -1].replace("$$", "$").replace("%%", "%")]


@pytest.mark.parametrize("retention", [None, "", "soon"])
def test_audit_prune_without_a_usable_retention_stops_with_one_line_and_prunes_nothing(
    tmp_path: Path, retention: str | None
) -> None:
    env = (
        {"PATH": "/usr/bin:/bin"}
        if retention is None
        else {"PATH": "/usr/bin:/bin", "SANDSTORM_AUDIT_RETENTION_DAYS": retention}
    )
    result = subprocess.run(audit_prune_command(tmp_path), env=env, capture_output=True, text=True)
    assert result.returncode != 0 and not (tmp_path / "ran").exists()
    output = (result.stdout + result.stderr).strip().splitlines()
    assert len(output) == 1
    if not retention:
        assert output == [
            "SANDSTORM_AUDIT_RETENTION_DAYS is not set in /etc/sandstorm-mcp.env: audit records are kept forever, nothing to prune"
        ]


def test_audit_prune_with_a_retention_prunes_before_that_many_days_ago(tmp_path: Path) -> None:
    result = subprocess.run(
        audit_prune_command(tmp_path), env={"PATH": "/usr/bin:/bin", "SANDSTORM_AUDIT_RETENTION_DAYS": "30"}
    )
    assert result.returncode == 0
    expected = subprocess.run(
        ["date", "-u", "-d", "30 days ago", "+%F"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (tmp_path / "ran").read_text().split() == [f"{REPO}/manage.py", "audit_prune", "--yes", "--before", expected]
