"""The security events in the admin: the `event` records as sentences (audit.event_sentences), with their raw
detail on each record's page."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from audit.admin_lists import ReadOnlyAuditAdmin, recent_values
from audit.event_sentences import event_sentence
from audit.filters import InvalidFilter, parse_moment
from audit.models import KIND_EVENT, AuditRecord, SecurityEvent


class DateFilter(admin.DateFieldListFilter):
    """The admin's date links (today, past 7 days, ...) for the security events, read as the call list reads its
    `created_at__gte` and `created_at__lt`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "date"

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        try:
            for name, values in self.used_parameters.items():
                moment = parse_moment(str(values[-1] if isinstance(values, list) else values), name)
                lookup = "gte" if name.endswith("__gte") else "lt"
                queryset = queryset.filter(**{f"created_at__unindexed__{lookup}": moment})
        except InvalidFilter as error:
            raise IncorrectLookupParameters(error) from error
        return queryset


class EventFilter(admin.SimpleListFilter):
    title = "event"
    parameter_name = "event"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        events = [(name, name) for (name,) in recent_values(KIND_EVENT, "event") if name]
        value = self.value()
        return events if not value or (value, value) in events else [*events, (value, value)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        value = self.value()
        return queryset if value is None else queryset.filter(event=value)


@admin.register(SecurityEvent)
class SecurityEventAdmin(ReadOnlyAuditAdmin):
    """Token created, revoked and first used, failed authentications, logins, prunes: the `event` records, each
    read as a sentence (audit.event_sentences); the record's page keeps the raw detail too."""

    list_display = ["time", "what_happened", "event"]
    list_filter = [EventFilter, ("created_at", DateFilter)]
    allowed_lookups = frozenset({"event", "created_at__gte", "created_at__lt"})
    fields = [
        "what_happened", "created_at", "event", "username", "credential_kind", "credential_id", "credential_name",
        "client_address", "user_agent", "instance_id", "detail_json",
    ]  # fmt: skip
    readonly_fields = ["what_happened", "detail_json"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditRecord]:
        return SecurityEvent.objects.filter(kind=KIND_EVENT).order_by("-id")

    @admin.display(description="what happened")
    def what_happened(self, record: AuditRecord) -> str:
        return event_sentence(record)

    @admin.display(description="detail (raw)")
    def detail_json(self, record: AuditRecord) -> str:
        if not record.detail:
            return "—"
        text = json.dumps(record.detail, indent=2, ensure_ascii=False, sort_keys=True)
        return format_html('<pre class="audit-detail-json">{}</pre>', text)
