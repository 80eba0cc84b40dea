"""The console's home page: what an admin wants to know first, each item a few bounded queries.

Every query over the audit log reads only the last day's records: bounded by id as well as by date (audit.views
`in_window`) and naming the kind of record, so the database reads the window from an index (audit/models.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from oauth2_provider.models import Application

from audit import recordings
from audit.budget import human
from audit.instances import HEARTBEAT_STALE, is_alive
from audit.models import (
    KIND_STARTED,
    OUTCOME_CANCELLED,
    OUTCOME_DENIED,
    OUTCOME_ERROR,
    OUTCOME_INTERRUPTED,
    OUTCOME_TIMEOUT,
    AuditRecord,
    ServerInstance,
)
from audit.views import in_window
from mcpserver.confinement_profile import protections
from oauth.agent_identity import executor_report, kernel_confinement
from oauth.credentials import KIND_BEARER, KIND_OAUTH
from oauth.lifetimes import access_token_seconds, in_words, refresh_token_seconds
from oauth.models import BearerToken, Revocation

DAY = timedelta(hours=24)
EXPIRY_HORIZON = timedelta(days=7)
FAILED_OUTCOMES = (OUTCOME_ERROR, OUTCOME_TIMEOUT, OUTCOME_DENIED, OUTCOME_CANCELLED, OUTCOME_INTERRUPTED)
SHOWN = 20  # rows per list; the linked pages have the rest
CLIENT_LABEL = re.compile(r"\(client (?P<client_id>[^()]*)\)$")  # oauth.credentials.application_label


def changelist(**params: str) -> str:
    return f"{reverse('admin:audit_auditrecord_changelist')}?{urlencode(params)}"


def stamp(moment: datetime) -> str:
    """A moment for a filter link, to the second."""
    return moment.replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class Executor:
    state: str  # "up", "down" or "unknown"
    user: str | None
    reported_at: datetime | None
    live_instances: int
    # The kernel's sandbox per profile and the default profile (mcpserver.confinement_profile.protections).
    confinement: dict[str, Any]


def executor_status(now: datetime) -> Executor:
    """What the MCP server in this process last learnt from the executor (at start-up and on each /health); the
    admin may run apart from /mcp (manage.py runserver), and then nothing was published here: "unknown"."""
    instances = ServerInstance.objects.filter(stopped_at__isnull=True, last_seen__gte=now - HEARTBEAT_STALE)
    live = sum(1 for instance in instances if is_alive(instance))
    report = executor_report()
    confinement = protections(kernel_confinement())
    if report is None:
        return Executor("unknown", None, None, live, confinement)
    return Executor("up" if report.user else "down", report.user, report.at, live, confinement)


def running_calls(now: datetime) -> list[dict[str, Any]]:
    """Calls of the last day with a started record and no finished one, written by a server that is still alive
    (a call of a server that died is finished as `interrupted` when a server starts)."""
    instances = ServerInstance.objects.filter(stopped_at__isnull=True, last_seen__gte=now - HEARTBEAT_STALE)
    alive = [instance.pk for instance in instances if is_alive(instance)]
    if not alive:
        return []
    started = AuditRecord.objects.filter(kind=KIND_STARTED, finished_record__isnull=True, instance_id__in=alive)
    rows = in_window(started, now - DAY).order_by("-id")[:SHOWN]
    return [
        {
            "record": record,
            "url": reverse("admin:audit_auditrecord_change", args=[record.pk]),
            "running_for": in_words(max(int((now - record.created_at).total_seconds()), 0)),
        }
        for record in rows
    ]


def connected_clients(now: datetime) -> list[dict[str, Any]]:
    """The credentials that made calls in the last day: a bearer token by its id, an OAuth client by its label
    (each refresh gives the client a new access token, so its calls carry several credential ids)."""
    since = now - DAY
    rows = (
        in_window(AuditRecord.objects.filter(kind=KIND_STARTED), since)
        .values("credential_kind", "credential_id", "credential_name", "username")
        .annotate(last_call=Max("created_at"), calls=Count("id"), newest=Max("id"))
        .order_by()
    )
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        kind = row["credential_kind"]
        key = (kind, row["credential_name"] if kind == KIND_OAUTH else row["credential_id"], row["username"])
        seen = merged.get(key)
        if seen is None:
            merged[key] = {**row}
            continue
        seen["calls"] += row["calls"]
        if row["newest"] > seen["newest"]:
            seen.update(newest=row["newest"], last_call=row["last_call"], credential_id=row["credential_id"])
    clients = sorted(merged.values(), key=lambda row: row["last_call"], reverse=True)[:SHOWN]
    client_ids = {
        match["client_id"]
        for row in clients
        if row["credential_kind"] == KIND_OAUTH and (match := CLIENT_LABEL.search(row["credential_name"]))
    }
    applications = dict(Application.objects.filter(client_id__in=client_ids).values_list("client_id", "pk"))
    for row in clients:
        row["page_url"] = page_of(row, applications)
        credential = f"{row['credential_kind']}:{row['credential_id']}"
        if row["credential_kind"] == KIND_OAUTH:
            # By the client's label: every access token it held in the day (a new one at each refresh).
            row["calls_url"] = changelist(
                credential_kind=KIND_OAUTH, credential_name=row["credential_name"], created_at__gte=stamp(since)
            )
        else:
            row["calls_url"] = changelist(credential=credential, created_at__gte=stamp(since))
    return clients


def page_of(row: dict[str, Any], applications: dict[str, int]) -> str:
    if row["credential_kind"] == KIND_BEARER and str(row["credential_id"]).isdigit():
        return reverse("admin:oauth_bearertoken_change", args=[row["credential_id"]])
    match = CLIENT_LABEL.search(row["credential_name"]) if row["credential_kind"] == KIND_OAUTH else None
    application = applications.get(match["client_id"]) if match else None
    return reverse("admin:oauth_connectedapp_change", args=[application]) if application else ""


def expiring_tokens(now: datetime) -> list[dict[str, Any]]:
    """Active bearer tokens that expire within EXPIRY_HORIZON, soonest first."""
    tokens = (
        BearerToken.objects.active(now)
        .filter(expires_at__lte=now + EXPIRY_HORIZON)
        .select_related("user")
        .order_by("expires_at")[:SHOWN]
    )
    return [
        {
            "token": token,
            "url": reverse("admin:oauth_bearertoken_change", args=[token.pk]),
            "expires_in": in_words_rounded(token.expires_at - now) if token.expires_at else "",
        }
        for token in tokens
    ]


def in_words_rounded(delta: timedelta) -> str:
    """A remaining time as a person says it: days, else hours, else minutes."""
    seconds = max(int(delta.total_seconds()), 0)
    for size in (86400, 3600, 60):
        if seconds >= size:
            return in_words(seconds // size * size)
    return "less than a minute"


@dataclass
class Failures:
    since: datetime
    counts: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    all_url: str = ""


def failures(now: datetime) -> Failures:
    """Finished calls of the last day per failed outcome. Only finished records have an outcome, and this count is
    answered from the (outcome, created_at) index alone, which is not partial: naming the kind would make SQLite
    leave it (the index notes in audit/models.py; audit.views.problem_counts counts the same way)."""
    since = now - DAY
    rows = (
        AuditRecord.objects.filter(outcome__in=FAILED_OUTCOMES, created_at__gte=since)
        .values_list("outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    found = dict(rows)
    result = Failures(since=since)
    for outcome in FAILED_OUTCOMES:
        count = found.get(outcome, 0)
        result.total += count
        result.counts.append(
            {"outcome": outcome, "count": count, "url": changelist(outcome=outcome, created_at__gte=stamp(since))}
        )
    # `outcome=failed` groups every failed outcome in the audit list.
    result.all_url = changelist(outcome="failed", created_at__gte=stamp(since))
    return result


def last_rotation() -> Revocation | None:
    return Revocation.objects.filter(reason=Revocation.REASON_ROTATION).order_by("-id").first()


def oauth_lifetimes() -> dict[str, str]:
    idle = refresh_token_seconds()
    return {"access": in_words(access_token_seconds()), "idle": in_words(idle) if idle else ""}


def recordings_status() -> dict[str, Any]:
    """The recordings' size against their budget (audit/recordings.py), and whether calls are recorded at all, as the
    home shows it."""
    state = recordings.state()
    return {
        "on": recordings.enabled(),
        "used": human(state["bytes"]),
        "budget": human(state["budget"]) if state["budget"] else "",
        "full": state["full"],
    }


def status_context() -> dict[str, Any]:
    now = timezone.now()
    return {
        "status_now": now,
        "executor": executor_status(now),
        "running_calls": running_calls(now),
        "connected_clients": connected_clients(now),
        "expiring_tokens": expiring_tokens(now),
        "expiry_horizon_days": EXPIRY_HORIZON.days,
        "failures": failures(now),
        "last_rotation": last_rotation(),
        "oauth_lifetimes": oauth_lifetimes(),
        "recordings": recordings_status(),
    }
