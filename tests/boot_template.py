"""A bootstrapped state made once per test process and copied for each live server, so that a boot is `manage.py
serve` alone instead of a migration, the admin's password hash and the token's import in a `bootstrap` first.

The template is what `manage.py bootstrap` leaves in a new state dir (the migrated SQLite database, the secret and
audit keys) with the session's bootstrap token and admin password; under PostgreSQL its database is a template
database that each server's is created from (`CREATE DATABASE … TEMPLATE`). A copy is the state a server of its own
would have after its own bootstrap: the same tables, users, token and audit records (their macs under the copied
audit key), and the keys are copied with it. Servers whose environment changes what bootstrap makes (another token
or password, another database or state dir, a separate executor) bootstrap as before.
"""

from __future__ import annotations

import atexit
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.database import ON_POSTGRES, drop_postgres_database, new_postgres_database

REPO = Path(__file__).resolve().parent.parent
# What `manage.py bootstrap` reads beyond the code: a server given any of these makes its own state.
BOOTSTRAP_INPUTS = frozenset(
    {
        "SANDSTORM_MCP_TOKEN",
        "SANDSTORM_ADMIN_PASSWORD",
        "SANDSTORM_STATE_DIR",
        "SANDSTORM_WORKSPACE_ROOT",
        "SANDSTORM_EXECUTOR_SOCKET",
        "SANDSTORM_SECRET_KEY",
        "DATABASE_URL",
    }
)


# What bootstrap leaves in a new state dir: the keys and (SQLite) the database, whose side files a clean close removes.
KNOWN_STATE = frozenset({"secret_key", "audit_key", "sandstorm.sqlite3"})


@dataclass(frozen=True)
class BootTemplate:
    state_dir: Path
    database_url: str  # the PostgreSQL template database, or "" on SQLite
    token: str
    admin_password: str

    def copy_to(self, state_dir: Path) -> dict[str, str]:
        """Lay a copy of the state in `state_dir` (which must not exist); the environment variables that select the
        copy's database (DATABASE_URL under PostgreSQL, nothing on SQLite)."""
        shutil.copytree(self.state_dir, state_dir)
        return {"DATABASE_URL": new_postgres_database(self.database_url)} if self.database_url else {}


_template: BootTemplate | None = None


def boot_template(env: Mapping[str, str]) -> BootTemplate:
    """This process's template, made on first use by bootstrapping with `env` (a server's environment without its
    own state dir, workspace, token and password)."""
    global _template
    if _template is None:
        _template = _make(env)
    return _template


def _make(env: Mapping[str, str]) -> BootTemplate:
    root = Path(tempfile.mkdtemp(prefix="sandstorm-boot-template-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    template = BootTemplate(
        state_dir=root / "state",
        database_url=new_postgres_database(tracked=False) if ON_POSTGRES else "",
        token="sst_test_" + secrets.token_urlsafe(24),
        admin_password=secrets.token_urlsafe(12),
    )
    if template.database_url:
        atexit.register(drop_postgres_database, template.database_url)
    bootstrap_env = {
        **{key: value for key, value in env.items() if key not in BOOTSTRAP_INPUTS},
        "SANDSTORM_STATE_DIR": str(template.state_dir),
        "SANDSTORM_WORKSPACE_ROOT": str(root / "workspace"),
        "SANDSTORM_MCP_TOKEN": template.token,
        "SANDSTORM_ADMIN_PASSWORD": template.admin_password,
    }
    if template.database_url:
        bootstrap_env["DATABASE_URL"] = template.database_url
    result = subprocess.run(
        [sys.executable, "manage.py", "bootstrap"],
        cwd=REPO,
        env=bootstrap_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode:
        raise AssertionError(f"bootstrapping the live servers' template failed:\n{result.stdout}{result.stderr}")
    # A file bootstrap starts to write one day (anchors, a log) may not be right to share: it is looked at first.
    unknown = sorted(path.name for path in template.state_dir.iterdir() if path.name not in KNOWN_STATE)
    if unknown:
        raise AssertionError(f"bootstrap left files the live servers' template does not know: {unknown}")
    return template
