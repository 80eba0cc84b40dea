"""Benchmark servers: Daphne via `manage.py serve` (tests/live.py's launcher) on a copy of a cached state dir.

Two state dirs are cached under the cache dir (var/bench/ by default), each keyed by everything that shapes the
database (the migrations, the Django version, the seed command): a migrated, empty one, and one holding N seeded
audit records (a million take minutes to seed, so they are seeded once). Each run copies them, so a run never
changes the cache. The copies share the cached secret key and audit key, which are for benchmarks only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import django

from tests.live import REPO, LiveServer, make_server, poll

CACHE_VERSION = "2"
START_DEADLINE = 90.0  # seconds for /health to answer: a loaded machine (a test run beside the bench) is slow
SEED_COMMAND = REPO / "audit" / "management" / "commands" / "audit_seed.py"


def schema_key() -> str:
    """A digest of what the cached databases depend on: every migration file, Django's version, the seed command."""
    digest = hashlib.sha256(f"{CACHE_VERSION} django {django.__version__}\n".encode())
    for path in sorted(REPO.glob("*/migrations/*.py")) + [SEED_COMMAND]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _run(env: dict[str, str], *args: str, timeout: float = 1800) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _builder_env(root: Path) -> dict[str, str]:
    return make_server(root).env


def _drop_stale(cache: Path, pattern: str, key: str) -> None:
    """Cached databases of another schema (a seeded one is large); builds in progress are left alone."""
    for old in cache.glob(pattern):
        if old.is_dir() and not old.name.endswith(key) and ".building" not in old.name:
            shutil.rmtree(old, ignore_errors=True)


def base_state(cache: Path, log: object = print) -> Path:
    """A migrated state dir and nothing else, not even the admin user: the seed command puts records after the
    newest one, so with the admin's token.created record in the log they would all fall in the last minute."""
    name = f"base-{schema_key()}"
    final = cache / name
    if (final / "state").is_dir():
        return final / "state"
    cache.mkdir(parents=True, exist_ok=True)
    _drop_stale(cache, "base-*", schema_key())
    building = cache / f"{name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    log(f"bench: migrating a fresh database into {final} (once per schema)")  # type: ignore[operator]
    _run(_builder_env(building), "manage.py", "migrate", "--verbosity", "0")
    return _publish(building, final)


def _publish(building: Path, final: Path) -> Path:
    """Move a finished build into place; if another run got there first, keep theirs."""
    shutil.rmtree(building / "workspace", ignore_errors=True)
    try:
        building.rename(final)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
        if not (final / "state").is_dir():
            raise
    return final / "state"


def seeded_state(cache: Path, count: int, log: object = print) -> Path:
    """A copy of the base state dir with `count` seeded audit records; built once per schema and count.

    When only the schema moved on, the seeded database of the old one is migrated instead of seeded again.
    """
    key = schema_key()
    final = cache / f"seed{count}-{key}"
    if (final / "state").is_dir():
        return final / "state"
    building = cache / f"{final.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    older = [path for path in cache.glob(f"seed{count}-*") if path.is_dir() and ".building" not in path.name]
    if older and _migrated(older[0], building, log):
        _drop_stale(cache, f"seed{count}-*", key)
        return _publish(building, final)
    base = base_state(cache, log)
    building.mkdir(parents=True)
    shutil.copytree(base, building / "state")
    log(f"bench: seeding {count:,} audit records into {final} (once per schema and count)")  # type: ignore[operator]
    _run(_builder_env(building), "manage.py", "audit_seed", str(count), "--random-seed", "6")
    _drop_stale(cache, "seed*-*", key)
    return _publish(building, final)


def _migrated(older: Path, building: Path, log: object) -> bool:
    """Move an older seeded database to `building` and migrate it; False (and nothing left) if that fails."""
    try:
        older.rename(building)
    except OSError:
        return False  # another run took it
    log(f"bench: migrating the seeded database {older.name} to the current schema")  # type: ignore[operator]
    try:
        _run(_builder_env(building), "manage.py", "migrate", "--verbosity", "0")
    except RuntimeError as error:
        log(f"bench: could not migrate it, seeding again ({str(error).splitlines()[0]})")  # type: ignore[operator]
        shutil.rmtree(building, ignore_errors=True)
        return False
    return True


def start_server(root: Path, state: Path, **overrides: str) -> LiveServer:
    """A server on a copy of `state` (LiveServer.start's steps, with the admin's password set between them)."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(state, root / "state", copy_function=_copy)
    server = make_server(root, **overrides)
    _run(server.env, "-m", "bench.dbtask", "prepare")  # bootstrap, and the admin's password set to the server's own
    with server.log_path.open("ab") as log:
        server.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve"], cwd=REPO, env=server.env, stdout=log, stderr=subprocess.STDOUT
        )
    poll(server.healthy, START_DEADLINE, what="the server's /health")
    return server


def _copy(source: str, destination: str) -> object:
    """cp with reflinks where the filesystem has them: the seeded database is large."""
    done = subprocess.run(["cp", "--reflink=auto", "-p", source, destination], capture_output=True, check=False)
    if done.returncode != 0:
        return shutil.copy2(source, destination)
    return destination
