"""deploy/install.sh run again on an installed throwaway host (tests/deploy_host.py) with changed options and files:
the agents' sudo rule, the audit retention, the executor's limits, an older socket unit."""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy_host import (  # noqa: F401 (fixtures)
    AGENT,
    Host,
    changes,
    installed,
    manifest,
    mode,
    owner,
    repo,
)

# The installer starts the installed units' server and executor for real (the production wiring, minus systemd): slow
# by nature. It runs without DATABASE_URL and installs on SQLite, so the PostgreSQL run leaves it out.
pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.same_on_any_database]


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
