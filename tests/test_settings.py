"""Configuration comes from the environment, read in settings.py only; bad values stop start-up with one line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDSTORM_") and k != "DATABASE_URL"}
    base.update(SANDSTORM_STATE_DIR=str(tmp_path / "state"), SANDSTORM_WORKSPACE_ROOT=str(tmp_path / "ws"))
    base.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=base, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("SANDSTORM_MCP_PORT", "eighty", "SANDSTORM_MCP_PORT must be a whole number"),
        ("SANDSTORM_MCP_PORT", "70000", "SANDSTORM_MCP_PORT must be at least 1 and at most 65535"),
        ("SANDSTORM_WORKSPACE_ROOT", "/nonexistent-parent/ws", "SANDSTORM_WORKSPACE_ROOT: the parent directory"),
        ("SANDSTORM_DEBUG", "maybe", "SANDSTORM_DEBUG must be"),
        ("SANDSTORM_PUBLIC_URL", "ftp://x", "SANDSTORM_PUBLIC_URL must be an http"),
        ("SANDSTORM_PUBLIC_URL", "https://x.example/path", "SANDSTORM_PUBLIC_URL must be an origin"),
        ("SANDSTORM_PUBLIC_URL", "https://mcp.example.com.", "SANDSTORM_PUBLIC_URL must name its host plainly"),
        ("SANDSTORM_PUBLIC_URL", "https://0x7f.0.0.1", "SANDSTORM_PUBLIC_URL must name its host plainly"),
        ("SANDSTORM_RATE_LIMIT", "-1", "SANDSTORM_RATE_LIMIT must be at least 0"),
        ("DATABASE_URL", "mysql://x/y", "DATABASE_URL must be a postgres"),
        ("SANDSTORM_TOOL_MAX_MEMORY", "1000", "SANDSTORM_TOOL_MAX_MEMORY must be 0 (off) or at least 67108864"),
        ("SANDSTORM_OUTPUT_MAX_BYTES", "-5", "SANDSTORM_OUTPUT_MAX_BYTES must be at least 0"),
        ("SANDSTORM_RECORDING_MAX_BYTES", "100", "SANDSTORM_RECORDING_MAX_BYTES must be 0 (off) or at least 4096"),
    ],
)
def test_a_bad_value_stops_start_up_with_one_line_naming_the_variable(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    result = run_manage(tmp_path, "check", **{variable: value})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]


def test_recording_max_bytes_0_turns_recording_off_rather_than_stopping_start_up(tmp_path: Path) -> None:
    script = "from django.conf import settings; from audit import recordings; "
    script += "print(settings.RECORDING_MAX_BYTES, recordings.enabled())"
    result = run_manage(tmp_path, "shell", "-c", script, SANDSTORM_RECORDING_MAX_BYTES="0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0 False"


def test_the_state_dir_may_not_live_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    result = run_manage(tmp_path, "check", SANDSTORM_STATE_DIR=str(tmp_path / "ws" / "state"))
    assert result.returncode == 2
    assert "SANDSTORM_STATE_DIR" in result.stderr and "must not be inside" in result.stderr


def test_the_secret_key_is_generated_once_into_the_state_dir_with_mode_0600(tmp_path: Path) -> None:
    assert run_manage(tmp_path, "check").returncode == 0
    key_file = tmp_path / "state" / "secret_key"
    first = key_file.read_text()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert run_manage(tmp_path, "check").returncode == 0
    assert key_file.read_text() == first and len(first.strip()) >= 50


def test_a_given_secret_key_is_used_and_nothing_is_generated(tmp_path: Path) -> None:
    assert run_manage(tmp_path, "check", SANDSTORM_SECRET_KEY="k" * 60).returncode == 0
    assert not (tmp_path / "state" / "secret_key").exists()


PRINT_SETTINGS = (
    "import json; from django.conf import settings as s; "
    "print(json.dumps({'debug': s.DEBUG, 'frame': s.X_FRAME_OPTIONS, 'cap': s.RESULT_CAP_BYTES, 'db': s.DATABASES['default']}, default=str))"
)


def test_defaults_are_safe(tmp_path: Path) -> None:
    """Without DATABASE_URL (the suite may run with one): SQLite in the state dir, WAL, IMMEDIATE transactions."""
    result = run_manage(tmp_path, "shell", "-c", PRINT_SETTINGS)
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values["debug"] is False and values["frame"] == "DENY" and values["cap"] == 262144
    database = values["db"]
    assert database["ENGINE"] == "django.db.backends.sqlite3"
    assert database["NAME"] == str(tmp_path / "state" / "sandstorm.sqlite3")
    assert database["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in database["OPTIONS"]["init_command"]
    assert database["OPTIONS"]["timeout"] >= 10


def test_database_url_selects_postgresql() -> None:
    from sandstorm_site.settings import _database_from_url

    config = _database_from_url("postgres://user:p%40ss@db.example:5433/sandstorm")
    assert config["ENGINE"] == "sandstorm_site.postgresql"
    assert (config["USER"], config["PASSWORD"], config["HOST"], config["PORT"], config["NAME"]) == (
        "user",
        "p@ss",
        "db.example",
        "5433",
        "sandstorm",
    )


def test_database_url_options_go_to_the_driver_and_a_socket_directory_is_a_host() -> None:
    from sandstorm_site.settings import _database_from_url

    config = _database_from_url("postgresql://sandstorm@/sandstorm?host=%2Frun%2Fpostgresql&sslmode=disable")
    assert config["OPTIONS"] == {"host": "/run/postgresql", "sslmode": "disable"}
    assert (config["HOST"], config["USER"], config["PASSWORD"]) == ("", "sandstorm", "")


def test_the_database_url_switches_every_command_to_postgresql(tmp_path: Path) -> None:
    url = "postgres://sandstorm:secret@db.example:5433/teamdb?sslmode=require"
    result = run_manage(tmp_path, "shell", "-c", PRINT_SETTINGS, DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
    database = json.loads(result.stdout.strip().splitlines()[-1])["db"]
    assert database["ENGINE"] == "sandstorm_site.postgresql" and database["NAME"] == "teamdb"
    assert (database["HOST"], database["PORT"], database["OPTIONS"]) == ("db.example", "5433", {"sslmode": "require"})
    assert not (tmp_path / "state" / "sandstorm.sqlite3").exists()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://u:p@host:port/db", "DATABASE_URL has a bad port"),
        ("postgres://u:p@host/", "DATABASE_URL must name the database"),
    ],
)
def test_a_bad_database_url_stops_start_up_with_one_line_that_keeps_the_password_out(
    tmp_path: Path, url: str, expected: str
) -> None:
    result = run_manage(tmp_path, "check", DATABASE_URL=url)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and expected in result.stderr
    assert ":p@" not in result.stderr
