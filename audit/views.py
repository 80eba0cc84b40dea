"""Staff pages beside the audit admin: the exports of the filtered call list, and the overview.

The exports stream: their rows are read with `aiterator`, a chunk at a time, and sent as they come (under ASGI a
response fed by a synchronous iterator would first be read whole into memory).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Count, Func, Max, Q, QuerySet
from django.db.models.functions import Substr, TruncHour
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from audit.budget import BudgetState, audit_log_bytes, human
from audit.export import CSV_HEADER, aexport_rows, call_queryset, csv_line, filter_calls, jsonl_line
from audit.filters import FAILED_OUTCOMES, OUTCOME_FAILED, InvalidFilter
from audit.models import KIND_EVENT, KIND_STARTED, AuditRecord

logger = logging.getLogger(__name__)

FLUSH_CHARS = 64 * 1024  # one send per this much text, not one per row
TOP_TOOLS = 10
ACTIVE_CREDENTIALS = 50
WINDOW_ID_SLACK = 1000
HOUR_KEY = "%Y-%m-%d %H"


@dataclass(frozen=True)
class ExportFormat:
    extension: str
    content_type: str
    header: str
    line: Callable[[Mapping[str, Any]], str]


FORMATS = {
    "csv": ExportFormat("csv", "text/csv; charset=utf-8", CSV_HEADER, csv_line),
    "jsonl": ExportFormat("jsonl", "application/jsonl; charset=utf-8", "", jsonl_line),
}


def require_view_permission(request: HttpRequest) -> None:
    if not request.user.has_perm("audit.view_auditrecord"):
        raise PermissionDenied


async def stream_lines(queryset: QuerySet[AuditRecord], export_format: ExportFormat) -> AsyncIterator[str]:
    buffer = [export_format.header]
    size = len(export_format.header)
    async for row in aexport_rows(queryset):
        line = export_format.line(row)
        buffer.append(line)
        size += len(line)
        if size >= FLUSH_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield "".join(buffer)


def export_calls(request: HttpRequest, export_format: str) -> HttpResponseBase:
    """The calls of the changelist with the same query parameters, oldest first, as a download."""
    require_view_permission(request)
    chosen = FORMATS[export_format]
    try:
        queryset = filter_calls(call_queryset(), request.GET)
    except InvalidFilter as error:
        return HttpResponseBadRequest(f"{error}\n", content_type="text/plain; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response = StreamingHttpResponse(stream_lines(queryset, chosen), content_type=chosen.content_type)
    response["Content-Disposition"] = f'attachment; filename="audit-calls-{stamp}.{chosen.extension}"'
    response["X-Content-Type-Options"] = "nosniff"
    logger.info("audit export (%s) by %s: %s", export_format, request.user, request.GET.urlencode())
    return response


def export_csv(request: HttpRequest) -> HttpResponseBase:
    return export_calls(request, "csv")


def export_jsonl(request: HttpRequest) -> HttpResponseBase:
    return export_calls(request, "jsonl")


# --- overview --------------------------------------------------------------------------------------------------

CHART_WIDTH, CHART_HEIGHT = 720, 200
PLOT_LEFT, PLOT_TOP, PLOT_BOTTOM = 44, 10, 170  # room for the count labels left and the time labels below


@dataclass(frozen=True)
class Bar:
    x: str
    y: str
    width: str
    height: str
    count: int
    label: str
    tick: str  # the axis label under this bar, if it gets one
    tick_x: str


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    bars: list[Bar]
    top: int
    total: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    left: int = PLOT_LEFT
    plot_top: int = PLOT_TOP
    bottom: int = PLOT_BOTTOM
    label_y: int = PLOT_BOTTOM + 18
    mid: int = (PLOT_TOP + PLOT_BOTTOM) // 2


def nice_top(peak: int) -> int:
    """The y axis maximum: the peak rounded up to 1, 2 or 5 times a power of ten."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if peak <= step * factor:
                return step * factor
        step *= 10


def build_chart(chart_id: str, title: str, buckets: list[tuple[str, str, int]], tick_every: int) -> Chart:
    """`buckets` are (axis label, full label, count), in time order."""
    top = nice_top(max((count for _, _, count in buckets), default=0))
    slot = (CHART_WIDTH - PLOT_LEFT) / max(len(buckets), 1)
    plot_height = PLOT_BOTTOM - PLOT_TOP
    bars = []
    for index, (tick, label, count) in enumerate(buckets):
        height = plot_height * count / top
        x = PLOT_LEFT + index * slot
        bars.append(Bar(
            x=f"{x + 1:.1f}", y=f"{PLOT_BOTTOM - height:.1f}", width=f"{slot - 2:.1f}", height=f"{height:.1f}",
            count=count, label=label, tick=tick if index % tick_every == 0 else "", tick_x=f"{x + slot / 2:.1f}",
        ))  # fmt: skip
    return Chart(chart_id, title, bars, top, sum(count for _, _, count in buckets))


def in_window(queryset: QuerySet[AuditRecord], since: datetime) -> QuerySet[AuditRecord]:
    """Records created since `since`. The id bound adds nothing to the date one but lets the database read just the
    window's rows (SQLite would otherwise walk a whole index): ids follow creation times except among writers racing
    for the chain lock, which WINDOW_ID_SLACK leaves room for."""
    first = (
        AuditRecord.objects.filter(created_at__gte=since).order_by("created_at").values_list("id", flat=True).first()
    )
    if first is None:
        return queryset.none()
    return queryset.filter(created_at__gte=since, id__gte=first - WINDOW_ID_SLACK)


def hour_bucket() -> Func:
    """created_at cut to the hour. SQLite's Trunc functions are Python callbacks, one call per row; SQLite stores a
    datetime as UTC text, so there its prefix is the bucket."""
    if connection.vendor == "sqlite" and settings.TIME_ZONE == "UTC":
        return Substr("created_at", 1, 13)
    return TruncHour("created_at")


def bucket_key(value: str | datetime, key: str) -> str:
    return value if isinstance(value, str) else timezone.localtime(value).strftime(key)


def hourly_chart(calls: QuerySet[AuditRecord], now: datetime) -> Chart:
    first = timezone.localtime(now).replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    rows = in_window(calls, first).annotate(hour=hour_bucket()).values("hour").annotate(n=Count("id")).order_by()
    counts = {bucket_key(row["hour"], HOUR_KEY): row["n"] for row in rows}
    hours = [first + timedelta(hours=offset) for offset in range(24)]
    buckets = [(f"{hour:%H}:00", f"{hour:%Y-%m-%d %H}:00", counts.get(hour.strftime(HOUR_KEY), 0)) for hour in hours]
    return build_chart("chart-hourly", "Calls per hour, last 24 hours", buckets, tick_every=3)


def month_of_calls(calls: QuerySet[AuditRecord], first_day: datetime) -> tuple[Chart, list[tuple[str, int]]]:
    """The daily chart and the busiest tools of the last 30 days.

    A day's count is a count over a range of the (kind, created_at) index and the tools come from the (kind, tool,
    created_at) one: neither reads a record, where grouping a month of records by day and tool reads every one.
    """
    starts = [first_day + timedelta(days=offset) for offset in range(31)]
    buckets = [
        (f"{start:%m-%d}", f"{start:%Y-%m-%d}", calls.filter(created_at__gte=start, created_at__lt=end).count())
        for start, end in pairwise(starts)
    ]
    per_tool = calls.filter(created_at__gte=first_day).values_list("tool").annotate(n=Count("id")).order_by()
    busiest = sorted(((tool, count) for tool, count in per_tool), key=lambda item: (-item[1], item[0]))[:TOP_TOOLS]
    return build_chart("chart-daily", "Calls per day, last 30 days", buckets, tick_every=5), busiest


def changelist_url(**params: str) -> str:
    return f"{reverse('admin:audit_auditrecord_changelist')}?{urlencode(params)}"


def problem_counts(day_ago: datetime, first_day: datetime) -> list[dict[str, Any]]:
    """Every outcome but ok, in the last 24 hours and the last 30 days, then all of them together ("failed"), each
    count linking to the list of those calls."""
    # Only finished records have an outcome; the (outcome, created_at) index answers each count without a record.
    problems = AuditRecord.objects.filter(outcome__in=FAILED_OUTCOMES, created_at__gte=first_day)
    totals = problems.aggregate(
        **{
            f"{outcome}_day": Count("id", filter=Q(outcome=outcome, created_at__gte=day_ago))
            for outcome in FAILED_OUTCOMES
        },
        **{f"{outcome}_month": Count("id", filter=Q(outcome=outcome)) for outcome in FAILED_OUTCOMES},
    )
    rows = [(outcome, totals[f"{outcome}_day"], totals[f"{outcome}_month"]) for outcome in FAILED_OUTCOMES]
    rows.append((OUTCOME_FAILED, sum(day for _, day, _ in rows), sum(month for _, _, month in rows)))
    return [
        {
            "outcome": outcome,
            "day": day,
            "month": month,
            "total": outcome == OUTCOME_FAILED,
            "day_url": changelist_url(outcome=outcome, created_at__gte=day_ago.isoformat()),
            "month_url": changelist_url(outcome=outcome, created_at__gte=first_day.isoformat()),
        }
        for outcome, day, month in rows
    ]


def active_credentials(calls: QuerySet[AuditRecord], day_ago: datetime) -> list[dict[str, Any]]:
    rows = (
        in_window(calls, day_ago)
        .values("credential_kind", "credential_id", "credential_name", "username")
        .annotate(last_used=Max("created_at"), calls=Count("id"))
        .order_by("-last_used")[:ACTIVE_CREDENTIALS]
    )
    return [
        {**row, "url": changelist_url(credential=f"{row['credential_kind']}:{row['credential_id']}")} for row in rows
    ]


def overview(request: HttpRequest) -> HttpResponse:
    """Calls per hour and per day, the busiest tools, the calls that failed (by outcome), and the credentials in use."""
    require_view_permission(request)
    now = timezone.now()
    day_ago = now - timedelta(hours=24)
    first_day = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=29)
    calls = AuditRecord.objects.filter(kind=KIND_STARTED)
    daily, busiest = month_of_calls(calls, first_day)
    context = {
        **admin.site.each_context(request),
        "title": "Audit overview",
        "charts": [hourly_chart(calls, now), daily],
        "tools": [{"tool": tool, "calls": count, "url": changelist_url(tool=tool)} for tool, count in busiest],
        "problems": problem_counts(day_ago, first_day),
        "credentials": active_credentials(calls, day_ago),
        **budget_context(),
    }
    return TemplateResponse(request, "admin/audit/overview.html", context)


def budget_context() -> dict[str, Any]:
    """The log's size against its budget (SANDSTORM_AUDIT_MAX_BYTES), measured now; nothing if there is none."""
    if not settings.AUDIT_MAX_BYTES:
        return {}
    budget = BudgetState(audit_log_bytes(), settings.AUDIT_MAX_BYTES)
    return {"budget": budget, "budget_used": human(budget.used), "budget_limit": human(budget.limit)}


# --- a call's policy decision (the call page) ---------------------------------------------------------------------


def policy_detail(record: AuditRecord) -> dict[str, Any] | None:
    """What the command policy decided for a started record (`detail.policy`), and, if it asked for approval, the
    decision as its `approval.decided` event recorded it (who, when, channel, latency, reason)."""
    policy = record.detail.get("policy") if isinstance(record.detail, dict) else None
    if not isinstance(policy, dict):
        return None
    approved = policy.get("approved")
    label = policy.get("request") or (approved.get("request") if isinstance(approved, dict) else None)
    shown: dict[str, Any] = {
        "decision": str(policy.get("decision", "")),
        "rule": str(policy.get("rule", "")),
        "reason": str(policy.get("reason", "")),
        "request": label if isinstance(label, str) else "",
        "decided": None,
    }
    if shown["request"] or shown["decision"] == "ask":
        shown["decided"] = approval_decided(record, shown["request"])
    return shown


def approval_decided(record: AuditRecord, label: str) -> dict[str, Any] | None:
    """The `approval.decided` event of request `label`, or, without a label (an ask the call itself waited for: its
    request is made after the started record), the one that names this call."""
    # Events only, by the (event, -id) index; a decision is recorded after the call it is about started.
    events = AuditRecord.objects.filter(kind=KIND_EVENT, event="approval.decided", id__gt=record.id)
    chosen = events.filter(detail__request=label) if label else events.filter(detail__call_id=record.call_id)
    found = chosen.order_by("id").first()
    if found is None:
        return None
    detail = found.detail if isinstance(found.detail, dict) else {}
    latency = detail.get("latency_ms")
    return {
        "request": str(detail.get("request", label)),
        "decision": str(detail.get("decision", "")).replace("_", " "),
        "by": found.username,
        "at": found.created_at,
        "channel": str(detail.get("channel", "")),
        "latency": f"{latency / 1000:.1f} s" if isinstance(latency, int) else "",
        "reason": str(detail.get("reason") or ""),
        "grant_minutes": detail.get("grant_minutes"),
    }
