"""What the audit log says about one credential, for its page in the console: its last call (when, from which address,
with which user agent), its recent calls, how many of its calls are running, and links into the audit list.

A bearer token's calls are found by its audit credential id (`bearer:<id>`, indexed). An OAuth client's calls carry
the id of whichever access token made them (one per refresh), so they are found by the client's label, which names
its client id, among the newest APP_CALL_WINDOW records.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from audit.admin import argument_summary
from audit.export import OUTCOME_RUNNING, finished_of
from audit.models import KIND_EVENT, KIND_STARTED, AuditRecord
from oauth.credentials import KIND_BEARER, KIND_OAUTH, application_label

RECENT_CALLS = 10
# A call still without its finished record after this long is not counted as running (its server died long ago).
RUNNING_WINDOW = timedelta(days=1)
APP_CALL_WINDOW = 200_000
CONSENT_EVENT = "oauth.consent"


@dataclass(frozen=True)
class CallLine:
    """One call, as a credential's page lists it."""

    record_id: int
    url: str
    time: datetime
    tool: str
    summary: str
    outcome: str


@dataclass(frozen=True)
class LastUse:
    time: datetime
    client_address: str
    user_agent: str
    url: str


def bearer_calls(token_id: int) -> QuerySet[AuditRecord]:
    """The started records of a bearer token, newest first (the `audit_credential_id` index)."""
    return AuditRecord.objects.filter(
        kind=KIND_STARTED, credential_kind=KIND_BEARER, credential_id=str(token_id)
    ).order_by("-id")


def app_calls(name: str, client_id: str) -> QuerySet[AuditRecord]:
    """The started records of an OAuth client's calls among the newest APP_CALL_WINDOW records, newest first."""
    newest = AuditRecord.objects.order_by("-id").values_list("id", flat=True).first() or 0
    return AuditRecord.objects.filter(
        id__gt=newest - APP_CALL_WINDOW,
        kind=KIND_STARTED,
        credential_kind=KIND_OAUTH,
        credential_name=application_label(name, client_id),
    ).order_by("-id")


def call_url(record_id: int) -> str:
    return reverse("admin:audit_auditrecord_change", args=[record_id])


def last_use(calls: QuerySet[AuditRecord]) -> LastUse | None:
    """The newest call: its time, address and user agent as the server saw them."""
    record = calls.only("id", "created_at", "client_address", "user_agent").first()
    if record is None:
        return None
    return LastUse(record.created_at, record.client_address, record.user_agent, call_url(record.pk))


def recent_calls(calls: QuerySet[AuditRecord], count: int = RECENT_CALLS) -> list[CallLine]:
    lines = []
    for record in calls.select_related("finished_record")[:count]:
        finished = finished_of(record)
        lines.append(
            CallLine(
                record_id=record.pk,
                url=call_url(record.pk),
                time=record.created_at,
                tool=record.tool,
                summary=argument_summary(record.arguments),
                outcome=finished.outcome if finished else OUTCOME_RUNNING,
            )
        )
    return lines


def running_count(calls: QuerySet[AuditRecord], now: datetime | None = None) -> int:
    """Calls started within RUNNING_WINDOW that have no finished record yet."""
    since = (timezone.now() if now is None else now) - RUNNING_WINDOW
    return calls.filter(created_at__gte=since, finished_record__isnull=True).count()


def audit_list_url(**params: str) -> str:
    return f"{reverse('admin:audit_auditrecord_changelist')}?{urlencode(params)}"


def credential_audit_url(kind: str, credential_id: int | str) -> str:
    return audit_list_url(credential=f"{kind}:{credential_id}")


def app_audit_url(name: str, client_id: str, **more: str) -> str:
    """The audit list of an OAuth client's calls: by its label, the same for every access token it held."""
    return audit_list_url(credential_kind=KIND_OAUTH, credential_name=application_label(name, client_id), **more)


def failed_yesterday_url(kind: str, credential_id: int | str) -> str:
    """The audit list of this credential's failed calls yesterday (the list's `outcome=failed` and `range=yesterday`
    choices)."""
    return audit_list_url(credential=f"{kind}:{credential_id}", outcome="failed", range="yesterday")


@dataclass(frozen=True)
class Approval:
    time: datetime
    username: str
    scope: str
    decision: str
    client_address: str
    url: str


def approvals(client_id: str, count: int = RECENT_CALLS) -> list[Approval]:
    """The consent decisions about a client, newest first: who approved (or refused) it, when, with which scope."""
    events = AuditRecord.objects.filter(kind=KIND_EVENT, event=CONSENT_EVENT, detail__client_id=client_id).order_by(
        "-id"
    )
    found = []
    for record in events[:count]:
        detail = record.detail if isinstance(record.detail, dict) else {}
        found.append(
            Approval(
                time=record.created_at,
                username=record.username,
                scope=str(detail.get("scope", "")),
                decision=str(detail.get("decision", "")),
                client_address=record.client_address,
                url=reverse("admin:audit_securityevent_change", args=[record.pk]),
            )
        )
    return found
