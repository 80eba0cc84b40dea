"""The audit log in the admin: read-only lists of calls and of security events, and a page per call.

Nobody, superusers included, may add, change or delete a record here. The lists stay fast on millions of records:
they never count the table (a page is fetched with one row more, which says whether an older page exists), never
sort by anything but the primary key, and build their filter choices from the newest records only.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.contrib.auth import get_permission_codename
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.http import urlencode
from django.utils.text import Truncator

from audit.credential_links import revoke_link
from audit.export import (
    FILTERS,
    OUTCOME_RUNNING,
    InvalidFilter,
    call_queryset,
    filter_by,
    finished_of,
    redacted_in,
    search_calls,
)
from audit.models import KIND_EVENT, KIND_STARTED, OUTCOMES, AuditRecord, SecurityEvent

# Filter choices come from this many newest records: a DISTINCT over the whole table would read all of it.
RECENT_RECORDS = 20_000
# A search in the list looks through this many newest records unless asked for all: a search that matches little
# reads every record it may look at (about a second per million here); the exports always search everything.
SEARCH_WINDOW = 200_000
SEARCH_ALL_PARAM = "search_all"
SUMMARY_CHARS = 80
# The argument that says most about a call, by tool family; otherwise the first argument.
SUMMARY_KEYS = ("command", "repo_url", "path", "packages", "message", "branch", "name", "pid")
CHANGELIST_TEMPLATE = "admin/audit/auditrecord/change_list.html"


class NoCountPaginator(Paginator):
    """A paginator that never counts the table: it reads its page plus one row, so `count` is exact up to the
    current page and one more than that when an older page exists."""

    def __init__(self, object_list: QuerySet[AuditRecord], per_page: int, page_number: int = 1) -> None:
        super().__init__(object_list, per_page)
        self.page_number = max(page_number, 1)

    @cached_property
    def rows(self) -> list[AuditRecord]:
        offset = (self.page_number - 1) * self.per_page
        return list(self.object_list[offset : offset + self.per_page + 1])

    @cached_property
    def count(self) -> int:
        return (self.page_number - 1) * self.per_page + len(self.rows)

    @property
    def has_more(self) -> bool:
        return len(self.rows) > self.per_page

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        if number == self.page_number:
            return Page(self.rows[: self.per_page], number, self)
        return super().page(number)


class NoCountChangeList(ChangeList):
    """A changelist that shows the rows its NoCountPaginator already read.

    When everything fits on one page, Django's changelist lists the whole queryset again instead of the page: a
    second run of the same query, which for a search that matches little scans the table twice.
    """

    def get_filters_params(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(SEARCH_ALL_PARAM, None)  # not a filter: how far a search looks
        return lookup_params

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        paginator = self.paginator
        if not self.multi_page and isinstance(paginator, NoCountPaginator) and paginator.page_number == 1:
            self.result_list = paginator.rows[: paginator.per_page]  # the lazy queryset above is never run


def recent_values(kind: str, *fields: str) -> list[tuple[Any, ...]]:
    """The distinct values of `fields` among the newest RECENT_RECORDS records of `kind`."""
    newest = AuditRecord.objects.order_by("-id").values_list("id", flat=True).first()
    if newest is None:
        return []
    recent = AuditRecord.objects.filter(kind=kind, id__gt=newest - RECENT_RECORDS)
    return list(recent.values_list(*fields).distinct().order_by(*fields))


RECENT_CALL_FIELDS = ("tool", "username", "credential_kind", "credential_id", "credential_name")


def recent_calls(request: HttpRequest) -> list[tuple[str, ...]]:
    """RECENT_CALL_FIELDS of the recent calls, distinct: one query a page, which the tool, user and credential
    filters share (three queries of their own cost three times as much)."""
    found: list[tuple[str, ...]] | None = getattr(request, "_audit_recent_calls", None)
    if found is None:
        found = recent_values(KIND_STARTED, *RECENT_CALL_FIELDS)
        request._audit_recent_calls = found  # type: ignore[attr-defined]  # a cache for this request only
    return found


class CallFilter(admin.SimpleListFilter):
    """A filter whose parameter and meaning are those of audit.export.FILTERS, so the exports filter the same way."""

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        options = self.options(request)
        value = self.value()
        if value and value not in {option for option, _ in options}:
            options.append((value, Truncator(value).chars(40)))  # the active filter always shows, and applies
        return options

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        value = self.value()
        if value is None:
            return queryset
        try:
            return filter_by(queryset, str(self.parameter_name), value)
        except InvalidFilter as error:
            raise IncorrectLookupParameters(error) from error  # the changelist shows its "?e=1" page


class ToolFilter(CallFilter):
    title = "tool"
    parameter_name = "tool"

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [(tool, tool) for tool in sorted({row[0] for row in recent_calls(request)}) if tool]


class OutcomeFilter(CallFilter):
    title = "outcome"
    parameter_name = "outcome"

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [(outcome, outcome) for outcome in OUTCOMES] + [(OUTCOME_RUNNING, OUTCOME_RUNNING)]


class UserFilter(CallFilter):
    title = "user"
    parameter_name = "user"

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted({row[1] for row in recent_calls(request)}) if name]


class CredentialFilter(CallFilter):
    title = "credential"
    parameter_name = "credential"

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        rows = sorted({row[2:] for row in recent_calls(request)})
        return [(f"{kind}:{id_}", f"{kind}:{name or id_}") for kind, id_, name in rows if kind]


class CredentialKindFilter(CallFilter):
    title = "credential kind"
    parameter_name = "credential_kind"

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [("bearer", "admin-issued token"), ("oauth", "OAuth client")]


class SessionFilter(CallFilter):
    """Shown only while active (from a call's "other calls of this session" link): sessions are too many to list."""

    title = "session"
    parameter_name = "session"

    def options(self, request: HttpRequest) -> list[tuple[str, str]]:
        return []


class DateFilter(admin.DateFieldListFilter):
    """The admin's date links (today, past 7 days, ...), applied by audit.export like every other filter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "date"

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        try:
            for name, values in self.used_parameters.items():
                queryset = filter_by(queryset, name, str(values[-1] if isinstance(values, list) else values))
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


def format_duration(milliseconds: int | None) -> str:
    if milliseconds is None:
        return ""
    if milliseconds < 1000:
        return f"{milliseconds} ms"
    if milliseconds < 60_000:
        return f"{milliseconds / 1000:.1f} s"
    minutes, seconds = divmod(milliseconds // 1000, 60)
    return f"{minutes} min {seconds} s"


def argument_summary(arguments: Any) -> str:
    """A one-line, plain-text glimpse of the arguments (the admin escapes it like any other text)."""
    if not isinstance(arguments, dict) or not arguments:
        return ""
    key = next((name for name in SUMMARY_KEYS if name in arguments), next(iter(arguments)))
    value = arguments[key]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if "source" in arguments and "dest" in arguments:
        text = f"{arguments['source']} → {arguments['dest']}"
    return Truncator(" ".join(str(text).split())).chars(SUMMARY_CHARS)


class ReadOnlyAuditAdmin(admin.ModelAdmin):
    """No add, change or delete for anyone; viewing for active staff with the model's view permission."""

    actions = None
    list_per_page = 100
    list_max_show_all = 0  # "show all" would load every record
    sortable_by = ()  # only the primary key order is indexed for every filter
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are a COUNT per choice
    change_list_template = CHANGELIST_TEMPLATE
    allowed_lookups: frozenset[str] = frozenset()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditRecord | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditRecord | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: AuditRecord | None = None) -> bool:
        user = request.user
        codename = get_permission_codename("view", self.opts)
        return bool(user.is_active and user.is_staff and user.has_perm(f"{self.opts.app_label}.{codename}"))

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.allowed_lookups

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return NoCountChangeList

    def get_paginator(self, request: HttpRequest, queryset: QuerySet[AuditRecord], per_page: int, orphans: int = 0,
                      allow_empty_first_page: bool = True) -> NoCountPaginator:  # fmt: skip
        try:
            page_number = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            page_number = 1
        return NoCountPaginator(queryset, per_page, page_number)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        changelist = context.get("cl") if context else None
        if context and isinstance(changelist, ChangeList):
            context.update(page_links(changelist))
        return response

    @admin.display(description="time")
    def time(self, record: AuditRecord) -> str:
        return f"{timezone.localtime(record.created_at):%Y-%m-%d %H:%M:%S}"


def search_floor(request: HttpRequest, search_term: str) -> int:
    """The id above which the list's search looks (the newest SEARCH_WINDOW records), or 0 for all of them."""
    if not search_term.strip() or request.GET.get(SEARCH_ALL_PARAM):
        return 0
    newest = AuditRecord.objects.order_by("-id").values_list("id", flat=True).first() or 0
    return max(newest - SEARCH_WINDOW, 0)


def page_links(changelist: ChangeList) -> dict[str, Any]:
    paginator = changelist.paginator
    page = changelist.page_num
    shown = len(changelist.result_list)
    first = (page - 1) * changelist.list_per_page + 1
    has_more = isinstance(paginator, NoCountPaginator) and paginator.has_more and changelist.multi_page
    return {
        "newer_url": changelist.get_query_string({PAGE_VAR: page - 1}) if page > 1 else "",
        "older_url": changelist.get_query_string({PAGE_VAR: page + 1}) if has_more else "",
        "shown_range": f"{first}–{first + shown - 1}" if shown else "none",
    }


def call_detail(record: AuditRecord) -> dict[str, Any]:
    """What the page of one call shows beyond the record itself."""
    finished = finished_of(record)
    detail = record.detail if isinstance(record.detail, dict) else {}
    large = detail.get("large_arguments")
    changelist = reverse("admin:audit_auditrecord_changelist")
    context: dict[str, Any] = {
        "call": record,
        "finished": finished,
        "outcome": finished.outcome if finished else OUTCOME_RUNNING,
        "duration": format_duration(finished.duration_ms) if finished else "",
        "arguments_json": json.dumps(record.arguments, indent=2, ensure_ascii=False, sort_keys=True),
        "redacted": redacted_in(record, finished),
        "large_arguments": [
            {"name": name, "size": info.get("size"), "sha256": info.get("sha256")}
            for name, info in (large.items() if isinstance(large, dict) else ())
            if isinstance(info, dict)
        ],
        "credential_calls_url": "",
        "session_calls_url": "",
        "revoke_url": "",
    }
    if record.credential_kind:
        credential = f"{record.credential_kind}:{record.credential_id}"
        context["credential_calls_url"] = f"{changelist}?{urlencode({'credential': credential})}"
    if record.session_id:
        context["session_calls_url"] = f"{changelist}?{urlencode({'session': record.session_id})}"
    if record.credential_kind:
        # The revoke confirmation of that token or app (not its page, where revoking is one more step away).
        context["revoke_url"] = revoke_link(record.credential_kind, record.credential_id) or ""
    return context


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnlyAuditAdmin):
    """The calls: one row per started record, with its finished record joined."""

    list_display = [
        "time", "tool", "arguments_summary", "username", "credential", "call_outcome", "duration", "call_exit_code",
        "call_redacted",
    ]  # fmt: skip
    list_filter = [
        ToolFilter, OutcomeFilter, UserFilter, CredentialFilter, CredentialKindFilter, SessionFilter,
        ("created_at", DateFilter),
    ]  # fmt: skip
    # Only shows the search box: get_search_results does the searching, the same way as the exports.
    search_fields = ["arguments", "finished_record__result_excerpt"]
    search_help_text = "Words in the arguments or the result excerpt."
    allowed_lookups = frozenset(FILTERS)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditRecord]:
        return call_queryset().order_by("-id")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[AuditRecord], search_term: str
    ) -> tuple[QuerySet[AuditRecord], bool]:
        found = search_calls(queryset, search_term)
        floor = search_floor(request, search_term)
        request.audit_search_floor = floor  # type: ignore[attr-defined]  # for the note under the search box
        return (found.filter(id__gt=floor) if floor else found), False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        params = request.GET.copy()
        for name in ("p", "o", "e", "all", SEARCH_ALL_PARAM):
            params.pop(name, None)
        context = {"title": "Tool calls", "audit_export_query": params.urlencode(), **(extra_context or {})}
        response = super().changelist_view(request, context)
        context_data = getattr(response, "context_data", None)
        changelist = context_data.get("cl") if context_data else None
        if context_data and getattr(request, "audit_search_floor", 0) and isinstance(changelist, ChangeList):
            context_data["audit_search_window"] = SEARCH_WINDOW
            context_data["audit_search_all_url"] = changelist.get_query_string({SEARCH_ALL_PARAM: "1"}, [PAGE_VAR])
        return response

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:  # fmt: skip
        record = self.get_object(request, unquote(object_id))
        if record is not None:
            extra_context = {**(extra_context or {}), **call_detail(record)}
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="arguments")
    def arguments_summary(self, record: AuditRecord) -> str:
        return argument_summary(record.arguments)

    @admin.display(description="credential")
    def credential(self, record: AuditRecord) -> str:
        return (
            f"{record.credential_kind}:{record.credential_name or record.credential_id}"
            if record.credential_kind
            else ""
        )

    @admin.display(description="outcome")
    def call_outcome(self, record: AuditRecord) -> str:
        finished = finished_of(record)
        return finished.outcome if finished else OUTCOME_RUNNING

    @admin.display(description="duration")
    def duration(self, record: AuditRecord) -> str:
        finished = finished_of(record)
        return format_duration(finished.duration_ms) if finished else ""

    @admin.display(description="redacted")
    def call_redacted(self, record: AuditRecord) -> str:
        """Where redaction masked a span (arguments, result), so a reviewer knows the text shown is not all of it."""
        return ", ".join(redacted_in(record, finished_of(record)))

    @admin.display(description="exit code")
    def call_exit_code(self, record: AuditRecord) -> int | None:
        finished = finished_of(record)
        return finished.exit_code if finished else None


@admin.register(SecurityEvent)
class SecurityEventAdmin(ReadOnlyAuditAdmin):
    """Token created, revoked and first used, failed authentications, logins, prunes: the `event` records."""

    list_display = ["time", "event", "username", "client_address", "detail_summary"]
    list_filter = [EventFilter, ("created_at", DateFilter)]
    allowed_lookups = frozenset({"event", "created_at__gte", "created_at__lt"})
    fields = [
        "created_at", "event", "username", "credential_kind", "credential_id", "credential_name",
        "client_address", "user_agent", "instance_id", "detail",
    ]  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditRecord]:
        return SecurityEvent.objects.filter(kind=KIND_EVENT).order_by("-id")

    @admin.display(description="detail")
    def detail_summary(self, record: AuditRecord) -> str:
        if not record.detail:
            return ""
        return Truncator(json.dumps(record.detail, ensure_ascii=False, sort_keys=True)).chars(SUMMARY_CHARS * 2)
