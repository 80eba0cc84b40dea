"""The console's record of approval requests (every R-17, as decided) and of timed grants, with "Revoke" for a grant
an admin regrets: the credential's calls of that command shape then ask again. Deciding a pending request happens
on its card (mcpserver/console_socket.py), not here.

Both are read-only: their lists fit a 1280 px window (oauth.console_lists), and each has a page that says who
asked for what under which rule, who decided, when and through which channel, with the call linked."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from audit.credential_links import credential_link
from audit.log import event, request_actor
from audit.models import KIND_STARTED, AuditRecord
from audit.visible import one_line
from mcpserver.approvals.requests import summary_of
from mcpserver.models import APPROVAL_PENDING, ApprovalGrant, ApprovalRequest
from mcpserver.process import INSTANCE_ID
from oauth.console_lists import ConsoleList, moment, status_badge, two_lines

# How a request was decided (mcpserver.approvals.requests: CHANNEL_*), in words.
CHANNEL_WORDS = {
    "console": "the console",
    "elicitation": "the client, whose user was asked",
    "timeout": "the timeout (nobody answered in time)",
    "ended": "the call's end (its client went away or the server stopped)",
}
GRANT_STATUSES = ("active", "expired", "revoked")


class ReadOnly(ConsoleList):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # what the audit log's approval events refer to


def credential_words(kind: str, credential_id: str, name: str) -> str:
    """A request's credential as its page and list name it: `bearer “laptop”`."""
    return f"{kind} “{name}”" if name else f"{kind} #{credential_id}"


def call_page(call_id: str) -> str:
    """The audit log's page of the call, if its started record is there."""
    record = AuditRecord.objects.filter(kind=KIND_STARTED, call_id=call_id).values_list("pk", flat=True).first()
    return reverse("admin:audit_auditrecord_change", args=[record]) if call_id and record is not None else ""


def grant_status(grant: ApprovalGrant) -> str:
    if grant.revoked_at is not None:
        return "revoked"
    return "active" if grant.expires_at > timezone.now() else "expired"


def request_detail(asked: ApprovalRequest) -> dict[str, Any]:
    """What a request's page shows beyond its fields."""
    latency = max((asked.decided_at - asked.created_at).total_seconds(), 0) if asked.decided_at else None
    grant = asked.grants.order_by("-id").first()
    return {
        "approval": asked,
        "state_badge": status_badge(asked.state),
        "state_words": asked.state.replace("_", " "),
        "command": summary_of(asked.tool, asked.arguments),
        "credential": credential_words(asked.credential_kind, asked.credential_id, asked.credential_name),
        "credential_url": credential_link(asked.credential_kind, asked.credential_id) or "",
        "call_url": call_page(asked.call_id),
        "channel_words": CHANNEL_WORDS.get(asked.channel, asked.channel),
        "latency": f"{latency:.1f} s" if latency is not None else "",
        "grant_url": reverse("admin:mcpserver_approvalgrant_change", args=[grant.pk]) if grant else "",
        "live_url": f"{reverse('admin:live')}?request={asked.pk}" if asked.state == APPROVAL_PENDING else "",
    }


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnly):
    list_display = ["label", "state_badge", "asked", "who", "what", "rule", "decided"]
    list_filter = ["state", "channel", "tool", "rule_id"]
    search_fields = ["username", "credential_name", "rule_id", "decided_by", "call_id"]
    list_per_page = 50
    change_form_template = "admin/mcpserver/approvalrequest/change_form.html"

    @admin.display(description="request", ordering="id")
    def label(self, obj: ApprovalRequest) -> str:
        return obj.label

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: ApprovalRequest) -> str:
        return status_badge(obj.state)

    @admin.display(description="asked", ordering="created_at")
    def asked(self, obj: ApprovalRequest) -> str:
        return moment(obj.created_at)

    @admin.display(description="who asked")
    def who(self, obj: ApprovalRequest) -> str:
        return two_lines(obj.username, credential_words(obj.credential_kind, obj.credential_id, obj.credential_name))

    @admin.display(description="tool and command")
    def what(self, obj: ApprovalRequest) -> str:
        command = one_line(summary_of(obj.tool, obj.arguments), 120)
        return format_html('{}<span class="list-second list-command">{}</span>', obj.tool, command)

    @admin.display(description="rule", ordering="rule_id")
    def rule(self, obj: ApprovalRequest) -> str:
        return obj.rule_id

    @admin.display(description="decided", ordering="decided_at")
    def decided(self, obj: ApprovalRequest) -> str:
        if obj.decided_at is None:
            return format_html('waits until<span class="list-second">{}</span>', moment(obj.expires_at))
        return two_lines(f"{obj.decided_by or '—'}, {obj.channel or '—'}", moment(obj.decided_at))

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        found = self.get_object(request, unquote(object_id))
        if found is not None and self.has_view_permission(request, found):
            extra_context = {
                **(extra_context or {}),
                **request_detail(found),
                "title": f"Approval request {found.label}",
                "subtitle": None,  # the title names it
            }
        return super().change_view(request, object_id, form_url, extra_context)


class GrantStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [(status, status) for status in GRANT_STATUSES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApprovalGrant]) -> QuerySet[ApprovalGrant]:
        unexpired = Q(expires_at__gt=timezone.now())
        chosen = {
            "active": Q(revoked_at__isnull=True) & unexpired,
            "expired": Q(revoked_at__isnull=True) & ~unexpired,
            "revoked": Q(revoked_at__isnull=False),
        }.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen)


@admin.register(ApprovalGrant)
class ApprovalGrantAdmin(ReadOnly):
    list_display = ["grant", "status", "who", "what", "granted_by", "expires"]
    list_filter = [GrantStatusFilter, "tool"]
    list_select_related = ["request"]
    actions = ["revoke"]
    change_form_template = "admin/mcpserver/approvalgrant/change_form.html"

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        """Revoking changes what a credential may do unasked: the change permission, though nothing is edited."""
        return bool(request.user.has_perm("mcpserver.change_approvalgrant"))

    @admin.display(description="grant of", ordering="request_id")
    def grant(self, obj: ApprovalGrant) -> str:
        return two_lines(obj.request.label, f"{obj.request.grant_minutes} minutes" if obj.request.grant_minutes else "")

    @admin.display(description="status")
    def status(self, obj: ApprovalGrant) -> str:
        return status_badge(grant_status(obj))

    @admin.display(description="credential")
    def who(self, obj: ApprovalGrant) -> str:
        asked = obj.request
        return two_lines(asked.username, credential_words(asked.credential_kind, asked.credential_id,
                                                          asked.credential_name))  # fmt: skip

    @admin.display(description="tool and command shape")
    def what(self, obj: ApprovalGrant) -> str:
        return format_html('{}<span class="list-second list-command">{}</span>', obj.tool, one_line(obj.shape, 120))

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: ApprovalGrant) -> str:
        return moment(obj.expires_at)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        grant = self.get_object(request, unquote(object_id))
        if grant is not None and self.has_view_permission(request, grant):
            asked = grant.request
            extra_context = {
                **(extra_context or {}),
                "grant": grant,
                "status_badge": status_badge(grant_status(grant)),
                "credential": credential_words(asked.credential_kind, asked.credential_id, asked.credential_name),
                "credential_url": credential_link(asked.credential_kind, asked.credential_id) or "",
                "request_url": reverse("admin:mcpserver_approvalrequest_change", args=[asked.pk]),
                "call_url": call_page(asked.call_id),
                "channel_words": CHANNEL_WORDS.get(asked.channel, asked.channel),
                "may_revoke": grant_status(grant) == "active" and self.has_revoke_permission(request),
                "title": f"Grant of {asked.label} to {asked.username}",
                "subtitle": None,  # the title names it; a grant has no name of its own
            }
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.action(description="Revoke the selected grants (their calls ask again)", permissions=["revoke"])
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
