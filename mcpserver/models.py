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

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["pid", "start_ticks"], name="bgproc_pid_ticks")]
        verbose_name = "background command"
        verbose_name_plural = "background commands"

    def __str__(self) -> str:
        return f"{self.pid}: {self.command[:60]}"
