"""The console's page of background commands: every user's, newest first, with the state the executor reports
(running, waiting for input, exited with its code, killed, lost) and their output size; "Stop" ends the selected
ones (SIGTERM to their process group and to all their job host adopted, even in sessions of their own, then
SIGKILL to what is left) and the audit log says who stopped what.

The rows are the registry (mcpserver.models.BackgroundProcess); the states come from the executor in one call per
page, through the executor client of the application this process serves."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from audit.log import event, request_actor
from audit.models import KIND_STARTED, AuditRecord
from audit.visible import one_line
from mcpserver.background import job_ref, stop_jobs
from mcpserver.executor.interface import Executor, ExecutorError
from mcpserver.models import BackgroundProcess
from mcpserver.process import INSTANCE_ID
from mcpserver.services import registered
from mcpserver.tools.jobs import state_text

UNKNOWN = {"state": "unknown", "size": None, "waiting_for_input": False}


def _executor() -> Executor | None:
    services = registered()
    return services.executor if services is not None else None


def job_states(rows: list[BackgroundProcess]) -> list[dict[str, Any]]:
    """What the executor says of each row, or `unknown` for all when it cannot be asked."""
    executor = _executor()
    if executor is None or not rows:
        return [UNKNOWN for _ in rows]
    try:
        return async_to_sync(executor.job_states)([job_ref(row) for row in rows])
    except (ExecutorError, OSError):
        return [UNKNOWN for _ in rows]


@admin.register(BackgroundProcess)
class BackgroundProcessAdmin(admin.ModelAdmin):
    list_display = [
        "pid", "username", "short_command", "started_at", "state", "output_size", "replay", "credential"
    ]  # fmt: skip
    list_display_links = None
    list_filter = ["username"]
    search_fields = ["command", "username", "=pid"]
    actions = ["stop"]
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: BackgroundProcess | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: BackgroundProcess | None = None) -> bool:
        return False  # the registry is what the audit log's pids refer to

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Titled in words, not Django's "Select background command to view".
        response = super().changelist_view(request, {"title": "Background commands", **(extra_context or {})})
        if isinstance(response, TemplateResponse) and response.context_data and "cl" in response.context_data:
            rows = list(response.context_data["cl"].result_list)
            calls = dict(
                AuditRecord.objects.filter(
                    kind=KIND_STARTED, call_id__in=[row.call_id for row in rows if row.call_id]
                ).values_list("call_id", "pk")
            )
            for row, state in zip(rows, job_states(rows), strict=True):
                row.job_state = state  # read by the columns below as the page renders
                row.call_pk = calls.get(row.call_id)
        return response

    @admin.display(description="command")
    def short_command(self, obj: BackgroundProcess) -> str:
        return one_line(obj.command, 120)

    @admin.display(description="state")
    def state(self, obj: BackgroundProcess) -> str:
        found = getattr(obj, "job_state", UNKNOWN)
        if found["state"] == "unknown":
            return "unknown (the executor did not answer)"
        text = state_text(found)
        return format_html('<span class="job-state job-state-{}">{}</span>', found["state"], text.split(":")[0])

    @admin.display(description="output")
    def output_size(self, obj: BackgroundProcess) -> str:
        size = getattr(obj, "job_state", UNKNOWN)["size"]
        return "" if size is None else f"{size:,} bytes"

    @admin.display(description="recording")
    def replay(self, obj: BackgroundProcess) -> str:
        """A link to the page of the call that started it, which plays its recording (as far as it goes, while it
        runs), or why there is none."""
        kept = obj.recording if isinstance(obj.recording, dict) else None
        call_pk = getattr(obj, "call_pk", None)
        if kept is not None and "name" not in kept:
            return f"not recorded: {kept.get('unrecorded') or 'it printed nothing'}"
        if call_pk is None:
            return ""
        url = reverse("admin:audit_auditrecord_change", args=[call_pk]) + "#recording"
        label = "▶ replay" if kept is not None else "▶ replay so far"
        return format_html('<a class="job-replay" href="{}">{}</a>', url, label)

    @admin.action(description="Stop the selected background commands")
    def stop(self, request: HttpRequest, queryset: QuerySet[BackgroundProcess]) -> None:
        executor = _executor()
        if executor is None:
            self.message_user(request, "The executor cannot be reached from this process.", messages.ERROR)
            return
        rows = list(queryset)
        try:
            stopped = async_to_sync(stop_jobs)(executor, rows)
        except ExecutorError as error:
            self.message_user(request, f"Nothing was stopped: the executor did not answer ({error}).", messages.ERROR)
            return
        if stopped:
            event(
                "console.background_stopped",
                request_actor(request),
                instance_id=INSTANCE_ID,
                pids=[row.pid for row in stopped],
                commands=[row.command[:200] for row in stopped],
                users=sorted({row.username for row in stopped}),
            )
        skipped = len(rows) - len(stopped)
        message = f"Sent SIGTERM to {len(stopped)} background command{'s' if len(stopped) != 1 else ''}"
        if skipped:
            message += f"; {skipped} {'was' if skipped == 1 else 'were'} not running"
        self.message_user(request, message + ".", messages.SUCCESS if stopped else messages.WARNING)


# The console's other mcpserver pages: the command policy, approval requests and timed grants.
from mcpserver import admin_approvals, admin_policy  # noqa: E402, F401
