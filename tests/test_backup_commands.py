"""The maintenance commands the timers run, without a server: backup's refusals and prune_output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from mcpserver.management.commands.backup import sqlite_database
from tests.database import requires_postgres
from tests.live import REPO, make_server


def test_backup_of_a_postgresql_database_says_to_use_pg_dump() -> None:
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "sandstorm"}
    with pytest.raises(CommandError, match="SQLite database only; for PostgreSQL .* pg_dump"):
        sqlite_database(postgres)


@pytest.mark.live  # manage.py in a process of its own, with a live server's environment
@requires_postgres
def test_backup_against_postgresql_exits_with_the_pg_dump_advice_and_writes_nothing(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    server.manage("migrate", "--no-input")
    result = server.manage("backup", str(tmp_path / "copy.sqlite3"), check=False)
    assert result.returncode == 1
    assert "for PostgreSQL (DATABASE_URL) use pg_dump" in result.stderr
    assert not list(tmp_path.glob("copy*"))


@pytest.mark.live  # manage.py in a process of its own, which starts an executor
def test_prune_output_removes_old_output_files_and_keeps_recent_ones(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    output = server.state_dir / "output"
    output.mkdir(parents=True)
    old, recent = output / "exec-old.stdout.log", output / "exec-new.stdout.log"
    old.write_text("old")
    recent.write_text("new")
    eight_days_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (eight_days_ago, eight_days_ago))
    result = subprocess.run(
        [sys.executable, "manage.py", "prune_output"],
        cwd=REPO,
        env=server.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not old.exists() and recent.exists()
    assert "1 of 2 files removed" in result.stdout


@pytest.mark.live  # manage.py in a process of its own, which starts an executor
def test_prune_output_deletes_the_oldest_files_until_the_directory_is_within_its_budget(tmp_path: Path) -> None:
    server = make_server(tmp_path, SANDSTORM_OUTPUT_MAX_BYTES="250")
    output = server.state_dir / "output"
    output.mkdir(parents=True)
    now = time.time()
    for name, age in {"exec-a.stdout.log": 300, "exec-b.stdout.log": 200, "exec-c.stdout.log": 100}.items():
        (output / name).write_bytes(b"x" * 100)
        os.utime(output / name, (now - age, now - age))
    result = server.manage("prune_output")
    assert sorted(path.name for path in output.iterdir()) == ["exec-b.stdout.log", "exec-c.stdout.log"]
    assert result.stdout.strip() == f"Pruned {output}: 1 of 3 files removed; 200 bytes left of its budget of 250."
    emptied = server.manage("prune_output", "--max-bytes", "0")
    assert not list(output.iterdir()) and "2 of 2 files removed; 0 bytes left" in emptied.stdout


@pytest.mark.live  # manage.py in a process of its own, which starts an executor
def test_prune_output_of_an_empty_output_directory_does_nothing(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    result = subprocess.run(
        [sys.executable, "manage.py", "prune_output"],
        cwd=REPO,
        env=server.env,
        capture_output=True,
        text=True,
        check=True,
    )
    # The executor makes its directory as it starts (confined commands are kept out of it by its path).
    assert "0 of 0 files removed" in result.stdout
