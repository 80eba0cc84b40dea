"""The console's record of approval requests (every R-17, as decided) and of timed grants, with "Revoke" for a grant
an admin regrets: the credential's calls of that command shape then ask again. Deciding a pending request happens
on its card (mcpserver/console_socket.py), not here."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from audit.log import event, request_actor
from audit.visible import one_line
from mcpserver.approvals.requests import summary_of
from mcpserver.models import ApprovalGrant, ApprovalRequest
from mcpserver.process import INSTANCE_ID


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # what the audit log's approval events refer to


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnly):
    list_display = ["label", "created_at", "state", "username", "credential_name", "tool", "command", "rule_id",
                    "decided_by", "channel"]  # fmt: skip
    list_filter = ["state", "channel", "tool", "rule_id"]
    search_fields = ["username", "credential_name", "rule_id", "decided_by", "call_id"]
    list_per_page = 50

    @admin.display(description="request", ordering="id")
    def label(self, obj: ApprovalRequest) -> str:
        return obj.label

    @admin.display(description="command or arguments")
    def command(self, obj: ApprovalRequest) -> str:
        return one_line(summary_of(obj.tool, obj.arguments), 120)


@admin.register(ApprovalGrant)
class ApprovalGrantAdmin(ReadOnly):
    list_display = ["credential_key", "tool", "shape", "expires_at", "granted_by", "request", "status"]
    list_filter = ["tool"]
    actions = ["revoke"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # The action needs it; the form is never shown (every field is read-only).
        return bool(request.user.has_perm("mcpserver.change_approvalgrant"))

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [field.name for field in ApprovalGrant._meta.fields]

    @admin.display(description="status")
    def status(self, obj: ApprovalGrant) -> str:
        if obj.revoked_at is not None:
            return f"revoked {obj.revoked_at:%Y-%m-%d %H:%M}"
        return "active" if obj.expires_at > timezone.now() else "expired"

    @admin.action(description="Revoke the selected grants (their calls ask again)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApprovalGrant]) -> None:
        live = queryset.filter(revoked_at=None, expires_at__gt=timezone.now())
        grants = list(live.select_related("request"))
        live.update(revoked_at=timezone.now())
        if grants:
            event(
                "approval.grants_revoked",
                request_actor(request),
                instance_id=INSTANCE_ID,
                requests=[grant.request.label for grant in grants],
                shapes=[f"{grant.tool}: {grant.shape}"[:200] for grant in grants],
            )
        message = f"Revoked {len(grants)} grant{'s' if len(grants) != 1 else ''}."
        self.message_user(request, message, messages.SUCCESS if grants else messages.WARNING)
