"""deploy/install.sh's dry runs and refusals on a fresh throwaway host (tests/deploy_host.py): nothing is changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy_host import (
    changes,
    make_host,
    manifest,
    repo,  # noqa: F401 (fixtures)
)

# The installer starts the installed units' server and executor for real (the production wiring, minus systemd): slow
# by nature. It runs without DATABASE_URL and installs on SQLite, so the PostgreSQL run leaves it out.
pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.same_on_any_database]


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
