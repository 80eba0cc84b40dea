"""The append-only audit log: one table of records chained by a keyed hash.

A tool call writes two records: `call.started` and `call.finished` (pointing at it). The started record is committed
before the tool runs; a read-only tool's two records may instead be committed together after it ran, before its
result leaves (docs/security.md, "The audit invariant").
Security events (tokens created/revoked/first used, failed authentications, logins, prunes) are `event` records.
Nothing in the application updates or deletes a record, except `audit_prune`, which leaves a checkpoint.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

KIND_STARTED = "call.started"
KIND_FINISHED = "call.finished"
KIND_EVENT = "event"
KIND_CHOICES = [(KIND_STARTED, "call started"), (KIND_FINISHED, "call finished"), (KIND_EVENT, "event")]

OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
OUTCOME_DENIED = "denied"
OUTCOME_TIMEOUT = "timeout"
OUTCOME_CANCELLED = "cancelled"
OUTCOME_INTERRUPTED = "interrupted"
# The call was answered "pending approval" (SANDSTORM_APPROVAL_HOLD): once approved it runs as a background command.
OUTCOME_PENDING = "pending"
OUTCOMES = [
    OUTCOME_OK,
    OUTCOME_ERROR,
    OUTCOME_DENIED,
    OUTCOME_TIMEOUT,
    OUTCOME_CANCELLED,
    OUTCOME_INTERRUPTED,
    OUTCOME_PENDING,
]
OUTCOME_CHOICES = [(outcome, outcome) for outcome in OUTCOMES]
# The key of a call record's `detail` that lists where redaction masked a span: the names of the arguments (started
# record) or "result" (finished record). In `detail`, so the chain's mac covers it like the rest of the record.
REDACTED_KEY = "redacted"


class AuditRecord(models.Model):
    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=KIND_CHOICES)
    created_at = models.DateTimeField(default=timezone.now)
    instance_id = models.CharField(max_length=32, blank=True, help_text="the server process that wrote it")
    call_id = models.CharField(max_length=32, blank=True, help_text="shared by a call's started and finished records")
    # A finished record points at its started one; no database constraint, so pruning can cut between them.
    started = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="finished_record"
    )

    # Who: the principal behind the request.
    user_id = models.IntegerField(null=True, blank=True)
    username = models.CharField(max_length=150, blank=True)
    credential_kind = models.CharField(max_length=16, blank=True)
    credential_id = models.CharField(max_length=64, blank=True)
    credential_name = models.CharField(max_length=200, blank=True)
    scope = models.CharField(max_length=100, blank=True)
    client_address = models.CharField(max_length=64, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    session_id = models.CharField(max_length=128, blank=True)
    protocol_version = models.CharField(max_length=32, blank=True)

    # What: the call and its arguments (secrets redacted, large values cut to head and tail).
    tool = models.CharField(max_length=64, blank=True)
    arguments = models.JSONField(null=True, blank=True)
    arguments_size = models.BigIntegerField(null=True, blank=True)
    arguments_sha256 = models.CharField(max_length=64, blank=True)

    # Outcome (finished records).
    outcome = models.CharField(max_length=16, blank=True, choices=OUTCOME_CHOICES)
    reason = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)
    result_excerpt = models.TextField(blank=True)
    result_size = models.BigIntegerField(null=True, blank=True)
    result_sha256 = models.CharField(max_length=64, blank=True)

    # Events; on call records, notes about the stored values (large arguments, where redaction masked a span).
    event = models.CharField(max_length=48, blank=True)
    detail = models.JSONField(null=True, blank=True)

    # The keyed hash chain: mac = HMAC-SHA-256(key, prev_mac + canonical content).
    prev_mac = models.CharField(max_length=64)
    mac = models.CharField(max_length=64)

    class Meta:
        ordering = ["-id"]
        verbose_name = "audit record"
        # Each index a record goes into costs its append a b-tree insert and a page in the commit, so an index that
        # serves one kind of record holds only that kind: the call list's filters index started records, the
        # outcome filter finished ones, the event filter events. A query uses such an index only if it names the
        # same kind (on SQLite the term must match, a bound parameter included), so every query that filters on
        # those columns says which kind it wants.
        indexes = [
            models.Index(fields=["kind", "-id"], name="audit_kind_id"),
            models.Index(fields=["tool", "-id"], name="audit_tool_id", condition=Q(kind=KIND_STARTED)),
            models.Index(
                fields=["credential_kind", "credential_id", "-id"],
                name="audit_credential_id",
                condition=Q(kind=KIND_STARTED),
            ),
            models.Index(fields=["username", "-id"], name="audit_user_id", condition=Q(kind=KIND_STARTED)),
            models.Index(fields=["outcome", "-id"], name="audit_outcome_id", condition=Q(kind=KIND_FINISHED)),
            models.Index(fields=["session_id", "-id"], name="audit_session_id", condition=Q(kind=KIND_STARTED)),
            models.Index(fields=["event", "-id"], name="audit_event_id", condition=Q(kind=KIND_EVENT)),
            models.Index(fields=["created_at"], name="audit_created"),
            models.Index(fields=["call_id"], name="audit_call"),
            # For the overview: calls per day, calls per tool and problems per outcome over a month, each read from
            # the index alone.
            models.Index(fields=["kind", "created_at"], name="audit_kind_created"),
            models.Index(
                fields=["kind", "tool", "created_at"], name="audit_kind_tool_created", condition=Q(kind=KIND_STARTED)
            ),
            # Not partial: SQLite counts problems faster from this index than from the (kind, created_at) one only
            # when the count does not name a kind, which a partial index would need.
            models.Index(fields=["outcome", "created_at"], name="audit_outcome_created"),
        ]

    def __str__(self) -> str:
        what = self.tool or self.event or self.kind
        return f"#{self.id} {self.kind} {what}"


class ChainHead(models.Model):
    """The newest mac, in one row that writers lock: concurrent calls can never fork the chain."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    mac = models.CharField(max_length=64)
    last_record_id = models.BigIntegerField(default=0)


class ChainCheckpoint(models.Model):
    """Left by audit_prune: the mac of the last pruned record, which the first remaining record chains from."""

    created_at = models.DateTimeField(default=timezone.now)
    pruned_before = models.DateTimeField()
    last_pruned_id = models.BigIntegerField()
    last_pruned_mac = models.CharField(max_length=64)
    records_pruned = models.BigIntegerField()

    class Meta:
        ordering = ["-last_pruned_id"]


class ServerInstance(models.Model):
    """A running (or once running) server process, so records of calls it never finished can be marked."""

    id = models.CharField(max_length=32, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)


class SecurityEvent(AuditRecord):
    """The `event` records, as a page of their own in the admin (a proxy: same table, no new columns)."""

    class Meta:
        proxy = True
        verbose_name = "security event"
