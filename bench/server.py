"""Benchmark servers: Daphne via `manage.py serve` (tests/live.py's launcher) on a copy of a cached state dir.

Two state dirs are cached under the cache dir (var/bench/ by default), each keyed by everything that shapes the
database (the migrations, the Django version, the seeder): a migrated, empty one, and one holding N seeded audit
records (a million take minutes to seed, so they are seeded once). Each run copies them, so a run never changes the
cache. The copies share the cached secret key and audit key, which are for benchmarks only.

Every step takes the source tree it runs (`tree`, this checkout by default; `--compare` passes an older one too):
its manage.py, its migrations, its seeder, its server, all under this interpreter and its virtualenv.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import django

from tests.live import REPO, LiveServer, make_server, poll

CACHE_VERSION = "2"
START_DEADLINE = 90.0  # seconds for /health to answer: a loaded machine (a test run beside the bench) is slow
# Limits that would otherwise measure themselves: no rate limit, more call slots and sessions than the load's 50
# clients (all on one token) use.
SERVER_SETTINGS = {
    "SANDSTORM_RATE_LIMIT": "0",
    "SANDSTORM_MAX_CONCURRENT_CALLS": "200",
    "SANDSTORM_MAX_SESSIONS_PER_CREDENTIAL": "200",
    "SANDSTORM_MAX_SESSIONS_PER_USER": "400",
    "SANDSTORM_LOG_FORMAT": "json",
}
SEEDER = Path("bench") / "seed.py"
# Where trees from before bench/seed.py kept the seeder: a management command.
OLD_SEED_COMMAND = Path("audit") / "management" / "commands" / "audit_seed.py"


STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def git_commit(tree: Path = REPO) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


@dataclass
class BenchServer(LiveServer):
    """A live server run from `tree`: its management commands and the bench's database jobs run from there too."""

    tree: Path = REPO

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.tree,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode:
            raise AssertionError(f"manage.py {' '.join(args)} exited with {result.returncode}:\n{result.stderr}")
        return result


def seeder(tree: Path = REPO) -> Path:
    """The tree's own seeder (bench/seed.py, or the audit_seed command of trees from before it moved)."""
    return SEEDER if (tree / SEEDER).is_file() else OLD_SEED_COMMAND


def schema_key(tree: Path = REPO) -> str:
    """A digest of what the cached databases depend on: every migration file, Django's version, the seeder."""
    digest = hashlib.sha256(f"{CACHE_VERSION} django {django.__version__}\n".encode())
    for path in sorted(tree.glob("*/migrations/*.py")) + [tree / seeder(tree)]:
        digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _run(env: dict[str, str], *args: str, tree: Path = REPO, timeout: float = 1800) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, check=False
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


def base_state(cache: Path, log: Callable[[str], object] = print, tree: Path = REPO) -> Path:
    """A migrated state dir and nothing else, not even the admin user: the seeder puts records after the newest
    one, so with the admin's token.created record in the log they would all fall in the last minute."""
    key = schema_key(tree)
    name = f"base-{key}"
    final = cache / name
    if (final / "state").is_dir():
        return final / "state"
    cache.mkdir(parents=True, exist_ok=True)
    _drop_stale(cache, "base-*", key)
    building = cache / f"{name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    log(f"bench: migrating a fresh database into {final} (once per schema)")
    _run(_builder_env(building), "manage.py", "migrate", "--verbosity", "0", tree=tree)
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


def seeded_state(
    cache: Path, count: int, log: Callable[[str], object] = print, tree: Path = REPO, reuse_older: bool = True
) -> Path:
    """A copy of the base state dir with `count` seeded audit records; built once per schema and count.

    When only the schema moved on, the seeded database of the old one is migrated instead of seeded again
    (`reuse_older`; not for a tree older than the cached database, which migrations cannot take back).
    """
    key = schema_key(tree)
    final = cache / f"seed{count}-{key}"
    if (final / "state").is_dir():
        return final / "state"
    building = cache / f"{final.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    older = [path for path in cache.glob(f"seed{count}-*") if path.is_dir() and ".building" not in path.name]
    if reuse_older and older and _migrated(older[0], building, log, tree):
        _drop_stale(cache, f"seed{count}-*", key)
        return _publish(building, final)
    base = base_state(cache, log, tree)
    building.mkdir(parents=True)
    shutil.copytree(base, building / "state")
    log(f"bench: seeding {count:,} audit records into {final} (once per schema and count)")
    if seeder(tree) == SEEDER:
        _run(_builder_env(building), "-m", "bench.dbtask", "seed", str(count), "--random-seed", "6", tree=tree)
    else:
        _run(_builder_env(building), "manage.py", "audit_seed", str(count), "--random-seed", "6", tree=tree)
    _drop_stale(cache, "seed*-*", key)
    return _publish(building, final)


def _migrated(older: Path, building: Path, log: Callable[[str], object], tree: Path) -> bool:
    """Move an older seeded database to `building` and migrate it; False (and nothing left) if that fails."""
    try:
        older.rename(building)
    except OSError:
        return False  # another run took it
    log(f"bench: migrating the seeded database {older.name} to the current schema")
    try:
        _run(_builder_env(building), "manage.py", "migrate", "--verbosity", "0", tree=tree)
    except RuntimeError as error:
        log(f"bench: could not migrate it, seeding again ({str(error).splitlines()[0]})")
        shutil.rmtree(building, ignore_errors=True)
        return False
    return True


def start_server(root: Path, state: Path, overrides: dict[str, str], tree: Path = REPO) -> BenchServer:
    """A server of `tree` on a copy of `state`, with `overrides` of its environment (LiveServer.start's steps, with
    the admin's password set between them)."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(state, root / "state", copy_function=_copy)
    made = make_server(root, **overrides)
    server = BenchServer(**{item.name: getattr(made, item.name) for item in fields(LiveServer) if item.init}, tree=tree)
    # bootstrap, and the admin's password set to the server's own
    _run(server.env, "-m", "bench.dbtask", "prepare", tree=tree)
    with server.log_path.open("ab") as log:
        server.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve"], cwd=tree, env=server.env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        poll(server.healthy, START_DEADLINE, what="the server's /health")
    except AssertionError:
        server.stop()  # not left running (with its executor)
        raise
    return server


def _copy(source: str, destination: str) -> object:
    """cp with reflinks where the filesystem has them: the seeded database is large."""
    done = subprocess.run(["cp", "--reflink=auto", "-p", source, destination], capture_output=True, check=False)
    if done.returncode != 0:
        return shutil.copy2(source, destination)
    return destination
