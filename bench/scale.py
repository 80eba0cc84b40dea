"""Section 8, scale (issue 20): what a second worker buys, what open sessions cost, and whether a quick call waits for
slow ones.

1. Two workers against one, on PostgreSQL: section 5's load (50 clients × 20 `terminal_exec true`) through Caddy,
   against one worker and against two (SANDSTORM_WORKERS=2), each stack built as tests/test_workers_live.py builds
   its own: Daphne on a Unix socket per worker, one executor on its socket, one Redis, a database of its own, Caddy
   serving deploy/Caddyfile. One worker goes the same way (Caddy, socket, Redis) so that the ratio is about the
   number of workers alone. Both stacks run side by side and take the load in turns; then each one's audit log is
   checked. Skipped, saying why, without DATABASE_URL, redis-server, caddy or systemd-socket-activate.
2. 1,000 open sessions held by 100 credentials: the server's RSS before and after, and a new client's connect
   (`initialize`'s round trip on a new connection) while they are open. One server, the bench's default (SQLite).
3. `file_read` of 1 KB alone, then while 100 `terminal_exec sleep 10` run in sessions of their own. One server,
   SQLite.
4. `file_read` of 1 KB with its audit records committed after the read (the default) against the started record
   committed before it (SANDSTORM_AUDIT_READS_BEFORE=1): two servers side by side, the calls in turns. SQLite, and
   PostgreSQL too when there is a DATABASE_URL.

Each figure is a module of its own: bench/scale_workers.py, scale_sessions.py, scale_sleepers.py, scale_reads.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import scale_reads, scale_sessions, scale_sleepers, scale_workers, sections
from bench.scale_sizes import ScaleSizes

__all__ = ["ScaleSizes", "measure"]


def measure(sizes: sections.Sizes, scale: ScaleSizes, base: Path, scratch: Path, postgres_url: str) -> dict[str, Any]:
    """The four figures; `base` is the migrated SQLite state dir, `postgres_url` the DATABASE_URL the bench started
    with (empty if none)."""
    return {
        "workers": scale_workers.workers_figure(sizes, scale, scratch / "workers", postgres_url),
        "sessions": scale_sessions.sessions_figure(scale, base, scratch / "sessions"),
        "sleepers": scale_sleepers.sleepers_figure(scale, base, scratch / "sleepers"),
        "reads": scale_reads.reads_figure(sizes, scale, base, scratch / "reads", postgres_url),
    }
