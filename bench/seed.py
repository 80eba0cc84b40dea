"""Bench-only: fill the audit log with realistic, correctly chained call records, fast.

Never run on a production audit log. Needs Django set up; the bench runs it on a benchmark server's database as

    python -m bench.dbtask seed COUNT [--batch N] [--random-seed S]

(N fake call records and a few events, spread over the last 30 days, instance 'bench-seed').
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from audit.log import CHAINED_FIELDS, compute_mac, lock_head
from audit.models import KIND_EVENT, KIND_FINISHED, KIND_STARTED, AuditRecord, ChainHead

SEED_INSTANCE = "bench-seed"
SPREAD = timedelta(days=30)
# (user_id, username, credential_kind, credential_id, credential_name, scope, client_address, user_agent)
CREDENTIALS = [
    (1, "admin", "bearer", "3", "claude-code laptop", "mcp", "127.0.0.1", "claude-code/2.1"),
    (1, "admin", "oauth", "7", "Claude Desktop", "mcp", "10.0.0.12", "Claude-User/1.0"),
    (2, "ci", "bearer", "5", "ci runner", "mcp", "10.0.4.2", "python-httpx/0.28"),
    (3, "reader", "bearer", "9", "dashboard", "mcp:read", "10.0.0.40", "mcp-inspector/0.9"),
]
# tool: (weight, arguments, typical result)
TOOLS: dict[str, tuple[int, dict[str, Any], str]] = {
    "file_read": (
        30,
        {"path": "src/app/main.py", "offset": 0},
        "import os\nimport sys\n\ndef main() -> None:\n    ...",
    ),
    "file_list": (12, {"path": "src"}, "app/\ntests/\npyproject.toml\nREADME.md"),
    "file_write": (
        10,
        {"path": "src/app/util.py", "content": "def helper() -> int:\n    return 42\n"},
        "wrote 36 bytes",
    ),
    "file_move": (1, {"source": "notes.txt", "destination": "docs/notes.txt"}, "moved"),
    "file_delete": (1, {"path": "build/tmp.log"}, "deleted"),
    "file_mkdir": (1, {"path": "docs"}, "created"),
    "terminal_exec": (25, {"command": "pytest -q", "timeout": 120}, "........ 8 passed in 1.92s"),
    "terminal_exec_background": (1, {"command": "npm run dev"}, "started background process 4123"),
    "terminal_kill": (1, {"pid": 4123}, "sent SIGTERM to 4123"),
    "git_status": (8, {"path": "repo"}, "On branch main\nnothing to commit, working tree clean"),
    "git_diff": (4, {"path": "repo"}, "diff --git a/src/app.py b/src/app.py\n+print('hi')"),
    "git_log": (2, {"path": "repo", "limit": 10}, "6c35bf3 fix timeout\n1f2e6bc audit log core"),
    "git_commit": (2, {"path": "repo", "message": "Fix the flaky test"}, "[main 9f1e2d3] Fix the flaky test"),
    "git_push": (1, {"path": "repo"}, "To github.com:example/app.git\n   6c35bf3..9f1e2d3  main -> main"),
    "git_pull": (1, {"path": "repo"}, "Already up to date."),
    "git_clone": (1, {"url": "https://github.com/example/app.git", "path": "repo"}, "cloned into repo"),
    "git_branch": (1, {"path": "repo"}, "* main\n  feature/x"),
    "git_checkout": (1, {"path": "repo", "ref": "feature/x"}, "Switched to branch 'feature/x'"),
    "workspace_info": (2, {}, "workspace: /srv/workspace, 1.2 GiB free"),
    "workspace_install": (1, {"packages": ["ripgrep"]}, "installed ripgrep"),
}
TOOL_NAMES = list(TOOLS)
TOOL_WEIGHTS = [TOOLS[name][0] for name in TOOL_NAMES]
# outcome, weight, reason
OUTCOMES = [
    ("ok", 88, ""),
    ("error", 8, ""),
    ("denied", 2, "read-only token"),
    ("timeout", 1, ""),
    ("cancelled", 1, ""),
]
OUTCOME_WEIGHTS = [weight for _, weight, _ in OUTCOMES]
EVENTS = ["auth.failed", "token.first_used", "admin.login", "token.created"]
EVENT_SHARE = 0.02


# Records are plain dicts of column values (model instances and bulk_create cost ten times as much per row).
Record = dict[str, Any]
_BLANK: Record = {
    field.attname: None if field.null else "" for field in AuditRecord._meta.concrete_fields if field.attname != "id"
}


@dataclass
class Pending:
    """A record to insert; a finished record's started_id is filled in once its started record has an id."""

    record: Record
    started: Record | None = None


def _record(**values: Any) -> Record:
    return {**_BLANK, "instance_id": SEED_INSTANCE, **values}


def _actor_fields(rng: random.Random) -> Record:
    user_id, username, kind, cred_id, cred_name, scope, address, agent = rng.choice(CREDENTIALS)
    return {
        "user_id": user_id, "username": username, "credential_kind": kind, "credential_id": cred_id,
        "credential_name": cred_name, "scope": scope, "client_address": address, "user_agent": agent,
        "session_id": f"s-{rng.getrandbits(40):010x}", "protocol_version": "2025-06-18",
    }  # fmt: skip


def _call(rng: random.Random, started_at: datetime, finished_at: datetime) -> Iterator[Pending]:
    tool = rng.choices(TOOL_NAMES, TOOL_WEIGHTS)[0]
    _, arguments, result = TOOLS[tool]
    outcome, _, reason = rng.choices(OUTCOMES, OUTCOME_WEIGHTS)[0]
    actor = _actor_fields(rng)
    call_id = f"{rng.getrandbits(128):032x}"
    argument_text = repr(sorted(arguments.items()))
    started = _record(
        kind=KIND_STARTED, created_at=started_at, call_id=call_id, tool=tool, arguments=arguments,
        arguments_size=len(argument_text), arguments_sha256=hashlib.sha256(argument_text.encode()).hexdigest(), **actor,
    )  # fmt: skip
    yield Pending(started)
    text = reason or (result if outcome == "ok" else f"Error: {tool} failed")
    ran = outcome in ("ok", "error") and tool.startswith("terminal")
    finished = _record(
        kind=KIND_FINISHED, created_at=finished_at, call_id=call_id, tool=tool, outcome=outcome, reason=reason,
        exit_code=(0 if outcome == "ok" else 1) if ran else None,
        duration_ms=int((finished_at - started_at).total_seconds() * 1000), result_excerpt=text,
        result_size=len(text.encode()), result_sha256=hashlib.sha256(text.encode()).hexdigest(), **actor,
    )  # fmt: skip
    yield Pending(finished, started)


def _event(rng: random.Random, at: datetime) -> Pending:
    name = rng.choice(EVENTS)
    actor = _actor_fields(rng)
    detail: dict[str, Any] = {"reason": "unknown token"} if name == "auth.failed" else {"token": actor["credential_id"]}
    return Pending(_record(kind=KIND_EVENT, created_at=at, event=name, detail=detail, **actor))


def generate(count: int, start: datetime, end: datetime, rng: random.Random) -> Iterator[Pending]:
    """`count` records with rising timestamps between start and end: calls (two records each) and a few events."""
    step = (end - start) / count
    times = (start + step * (index + rng.random() * 0.9) for index in range(count))
    made = 0
    while made < count:
        if count - made == 1 or rng.random() < EVENT_SHARE:
            yield _event(rng, next(times))
            made += 1
        else:
            yield from _call(rng, next(times), next(times))
            made += 2


def _insert(records: list[Record]) -> None:
    """Insert with one executemany; the values that need it are prepared by their model fields."""
    fields = AuditRecord._meta.concrete_fields
    prepared = [field for field in fields if field.attname in ("created_at", "arguments", "detail")]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(AuditRecord._meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    for record in records:
        for field in prepared:
            record[field.attname] = field.get_db_prep_save(record[field.attname], connection)
    with connection.cursor() as cursor:
        cursor.executemany(sql, [[record[field.attname] for field in fields] for record in records])


def insert_batch(batch: list[Pending], key: bytes) -> None:
    """Chain `batch` onto the head and insert it, in one transaction holding the head's lock."""
    with transaction.atomic():
        prev = lock_head().mac
        next_id = (AuditRecord.objects.aggregate(last=Max("id"))["last"] or 0) + 1
        records = []
        for offset, pending in enumerate(batch):
            record = pending.record
            record["id"] = next_id + offset
            if pending.started is not None:
                record["started_id"] = pending.started["id"]
            record["prev_mac"] = prev
            record["mac"] = prev = compute_mac(key, [record[name] for name in CHAINED_FIELDS], prev)
            records.append(record)
        _insert(records)
        ChainHead.objects.filter(pk=1).update(mac=prev, last_record_id=records[-1]["id"])
        # Explicit ids leave PostgreSQL's sequence behind (SQLite needs nothing): move it on before the lock is let
        # go, or the next writer's id would be one of ours.
        with connection.cursor() as cursor:
            for sql in connection.ops.sequence_reset_sql(no_style(), [AuditRecord]):
                cursor.execute(sql)


def seed(count: int, batch: int = 5000, random_seed: int | None = None) -> str:
    """Append `count` records after the newest one, `batch` per transaction; a one-line summary of what it did."""
    if count < 1 or batch < 1:
        raise ValueError("count and batch must be at least 1")
    rng = random.Random(random_seed)
    end = timezone.now()
    newest = AuditRecord.objects.aggregate(newest=Max("created_at"))["newest"]
    # Timestamps rise with ids, after any existing record (pruning cuts the chain by date).
    start = max(end - SPREAD, newest or end - SPREAD)
    end = max(end, start)
    key = settings.AUDIT_HMAC_KEY
    pending: list[Pending] = []
    for item in generate(count, start, end, rng):
        pending.append(item)
        if len(pending) >= batch:
            insert_batch(pending, key)
            pending = []
    if pending:
        insert_batch(pending, key)
    return f"Seeded {count} audit records from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC."
