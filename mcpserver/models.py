"""The registry of background processes this server started, kept in the database so that terminal_kill still
recognises them after the server restarts."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class BackgroundProcess(models.Model):
    pid = models.IntegerField()
    pgid = models.IntegerField()
    # With the pid, the kernel's start time (clock ticks since boot) names one process for its whole life,
    # so a reused pid is never mistaken for the process we started.
    start_ticks = models.BigIntegerField()
    command = models.TextField()
    cwd = models.TextField(blank=True)
    log_path = models.TextField()
    credential = models.CharField(max_length=64, help_text="kind:id of the credential that started it")
    username = models.CharField(max_length=150)
    instance_id = models.CharField(max_length=32, help_text="the server process that started it")
    started_at = models.DateTimeField(default=timezone.now)
    signalled_at = models.DateTimeField(null=True, blank=True)
    # Its recording (mcpserver/job_recordings.py): the call that started it, how far its events are kept, which
    # server process keeps them (and when it last did), and, once the job is over, what its audit event says of it.
    call_id = models.CharField(max_length=32, blank=True, help_text="the audit log's call that started it")
    recorded_offset = models.BigIntegerField(default=0)
    recorder = models.CharField(max_length=32, blank=True)
    recorder_seen = models.DateTimeField(null=True, blank=True)
    recording = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["pid", "start_ticks"], name="bgproc_pid_ticks"),
            # The jobs whose recordings are still followed, which every server process looks for once a second.
            models.Index(fields=["id"], name="bgproc_unrecorded", condition=models.Q(recording__isnull=True)),
        ]
        verbose_name = "background command"
        verbose_name_plural = "background commands"

    def __str__(self) -> str:
        return f"{self.pid}: {self.command[:60]}"


DECISION_CHOICES = [("allow", "allow"), ("ask", "ask"), ("deny", "deny")]


class PolicyRule(models.Model):
    """One rule of the command policy, in the order `position` gives (mcpserver/policy/rules.py: `spec` is a rule's
    JSON, `Rule.from_dict` checks it before it is saved)."""

    position = models.PositiveIntegerField()
    rule_id = models.CharField(max_length=64, unique=True, help_text="the name the audit log shows")
    spec = models.JSONField(help_text="the rule as JSON (docs: Policy and approval)")
    enabled = models.BooleanField(default=True)
    recommended = models.BooleanField(default=False, help_text="part of the recommended set")
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["position", "id"]
        verbose_name = "policy rule"
        verbose_name_plural = "command policy"

    def __str__(self) -> str:
        return self.rule_id


class PolicySettings(models.Model):
    """The policy's one row: what no rule decides, what an opaque command gets, and a version every change bumps
    (so that each server process reloads the rules it caches)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    default = models.CharField(max_length=8, choices=DECISION_CHOICES, default="allow")
    opaque = models.CharField(
        max_length=8, choices=DECISION_CHOICES, blank=True, help_text="empty: ask if any rule asks, else the default"
    )
    version = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        verbose_name = "policy settings"
        verbose_name_plural = "policy settings"


APPROVAL_PENDING = "pending"
APPROVAL_APPROVED = "approved"
APPROVAL_DENIED = "denied"
APPROVAL_TIMED_OUT = "timed_out"
APPROVAL_CANCELLED = "cancelled"  # the call ended first: its client went away, or the server stopped
APPROVAL_STATES = [APPROVAL_PENDING, APPROVAL_APPROVED, APPROVAL_DENIED, APPROVAL_TIMED_OUT, APPROVAL_CANCELLED]


class ApprovalRequest(models.Model):
    """A call held until someone approves or denies it (R-<id>). Bound to its exact arguments, its credential and
    its call: approving it runs that call once."""

    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=[(s, s) for s in APPROVAL_STATES], default=APPROVAL_PENDING)
    call_id = models.CharField(max_length=32, help_text="the audit log's call id")
    instance_id = models.CharField(max_length=32, help_text="the server process holding the call")
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(help_text="as the audit log keeps them (secrets masked)")
    arguments_sha256 = models.CharField(max_length=64)
    shape = models.CharField(max_length=300, help_text="what a timed grant covers (same tool, same command shape)")
    cwd = models.TextField(blank=True)
    user_id = models.IntegerField(null=True)
    username = models.CharField(max_length=150)
    credential_key = models.CharField(max_length=80, help_text="the principal's key")
    credential_kind = models.CharField(max_length=16)
    credential_id = models.CharField(max_length=64)
    credential_name = models.CharField(max_length=200, blank=True)
    client_id = models.CharField(max_length=200, blank=True)
    client_address = models.CharField(max_length=64, blank=True)
    rule_id = models.CharField(max_length=64)
    rule_reason = models.TextField(blank=True)
    user_may_approve = models.BooleanField(default=False, help_text="the rule lets the client's own user approve")
    held = models.BooleanField(default=False, help_text="the client was answered 'pending' (the hold)")
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    channel = models.CharField(max_length=16, blank=True, help_text="console, elicitation or timeout")
    reason = models.TextField(blank=True, help_text="a denial's reason, given to the agent verbatim")
    grant_minutes = models.PositiveIntegerField(null=True, blank=True)
    background = models.ForeignKey(BackgroundProcess, null=True, blank=True, on_delete=models.SET_NULL)
    outcome = models.TextField(blank=True, help_text="what became of an approved held call")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["state", "-id"], name="approval_state_id")]
        verbose_name = "approval request"

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        return f"R-{self.pk}"


class ApprovalGrant(models.Model):
    """'Approve this credential for N minutes': calls of the same tool and command shape by this credential run
    without asking until `expires_at`."""

    credential_key = models.CharField(max_length=80)
    tool = models.CharField(max_length=64)
    shape = models.CharField(max_length=300)
    expires_at = models.DateTimeField()
    granted_by = models.CharField(max_length=150)
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="grants")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["credential_key", "tool", "shape"], name="grant_lookup")]
