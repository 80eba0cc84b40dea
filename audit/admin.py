"""The audit log's calls in the admin: the call list (its filter bar, cells and search window) and a page per call,
headed in words, with the player of its recording (audit/static/audit/recording.js) when it has one.

The lists never count and never change a record (audit.admin_lists); the security events have their own list
(audit.admin_events, imported here so that the admin finds it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.http import urlencode

from audit import admin_events  # noqa: F401  (registers the security events' admin)
from audit.admin_lists import SEARCH_ALL_PARAM, NoCountChangeList, ReadOnlyAuditAdmin, recent_values
from audit.call_recordings import has_recording, recording_detail
from audit.credential_links import revoke_link
from audit.export import call_queryset, finished_of, redacted_in, search_calls
from audit.filter_bar import filter_bar, query
from audit.filters import (
    FILTER_PARAMS,
    OUTCOME_RUNNING,
    OUTCOME_VALUES,
    CallFilters,
    InvalidFilter,
    param_lists,
    parse_filters,
)
from audit.models import KIND_STARTED, AuditRecord
from audit.views import policy_detail
from audit.visible import one_line, shorten
from audit.why import failure_line

# A search in the list looks through this many newest records unless asked for all: a search that matches little
# reads every record it may look at (about a second per million here); the exports always search everything.
SEARCH_WINDOW = 200_000
SUMMARY_CHARS = 80
DESCRIPTION_CHARS = 500  # as terminal_exec takes it
# The argument that says most about a call, by tool family; otherwise the first argument.
SUMMARY_KEYS = ("command", "repo_url", "path", "packages", "message", "branch", "name", "pid")
LIST_DESCRIPTION_CHARS = 120  # the agent's description under the command, in the list (its page shows it all)

RECENT_CALL_FIELDS = ("tool", "username", "credential_kind", "credential_id", "credential_name")


def recent_calls(request: HttpRequest) -> list[tuple[str, ...]]:
    """RECENT_CALL_FIELDS of the recent calls, distinct: one query a page, which the tool, user and credential
    filters share (three queries of their own cost three times as much)."""
    found: list[tuple[str, ...]] | None = getattr(request, "_audit_recent_calls", None)
    if found is None:
        found = recent_values(KIND_STARTED, *RECENT_CALL_FIELDS)
        request._audit_recent_calls = found  # type: ignore[attr-defined]  # a cache for this request only
    return found


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
    return one_line(str(text), SUMMARY_CHARS)  # hidden characters spelled out before whitespace is folded


def search_floor(request: HttpRequest, search_term: str) -> int:
    """The id above which the list's search looks (the newest SEARCH_WINDOW records), or 0 for all of them."""
    if not search_term.strip() or request.GET.get(SEARCH_ALL_PARAM):
        return 0
    newest = AuditRecord.objects.order_by("-id").values_list("id", flat=True).first() or 0
    return max(newest - SEARCH_WINDOW, 0)


def agent_description(arguments: Any) -> str:
    """What the agent said its command is for (terminal_exec's `description`), on one line, hidden characters
    spelled out: the agent's words, which the page marks as such."""
    described = arguments.get("description") if isinstance(arguments, dict) else None
    return one_line(described, DESCRIPTION_CHARS) if isinstance(described, str) else ""


def call_heading(record: AuditRecord) -> str:
    """The call page's heading, in words: "terminal_exec by alice — 2026-12-07 15:04:05 UTC" (not the record's
    kind, which every call page shares)."""
    who = record.username or credential_label(record.credential_kind, record.credential_id, record.credential_name)
    when = date_format(timezone.localtime(record.created_at), "DATETIME_FORMAT")
    return f"{record.tool} by {who or 'an unknown caller'} — {when}"


def call_detail(record: AuditRecord) -> dict[str, Any]:
    """What the page of one call shows beyond the record itself."""
    finished = finished_of(record)
    detail = record.detail if isinstance(record.detail, dict) else {}
    large = detail.get("large_arguments")
    changelist = reverse("admin:audit_auditrecord_changelist")
    context: dict[str, Any] = {
        "title": call_heading(record),
        "subtitle": None,  # Django's would be str(record): "#12 call.started terminal_exec"
        "recording": recording_detail(record, finished),
        "call": record,
        "finished": finished,
        "outcome": finished.outcome if finished else OUTCOME_RUNNING,
        "duration": format_duration(finished.duration_ms) if finished else "",
        "arguments_json": json.dumps(record.arguments, indent=2, ensure_ascii=False, sort_keys=True),
        "agent_description": agent_description(record.arguments),
        "redacted": redacted_in(record, finished),
        "large_arguments": [
            {"name": name, "size": info.get("size"), "sha256": info.get("sha256")}
            for name, info in (large.items() if isinstance(large, dict) else ())
            if isinstance(info, dict)
        ],
        "credential_calls_url": "",
        "session_calls_url": "",
        "revoke_url": "",
        "policy": policy_detail(record),
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


class CallChangeList(NoCountChangeList):
    """The call list's changelist: the parameters of audit.filters are no admin lookups, they select the calls the
    way the exports select them (repeated parameters included), as the request's CallFilters."""

    def get_filters_params(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        lookup_params = super().get_filters_params(params)
        for name in FILTER_PARAMS:
            lookup_params.pop(name, None)
        return lookup_params

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[AuditRecord]:
        return call_filters(request).apply(super().get_queryset(request, exclude_parameters))


def call_filters(request: HttpRequest) -> CallFilters:
    """The filters of this request's parameters, read once (a range such as "today" is fixed at the first read)."""
    found: CallFilters | None = getattr(request, "_audit_call_filters", None)
    if found is None:
        found = parse_filters(request.GET)
        request._audit_call_filters = found  # type: ignore[attr-defined]  # a cache for this request only
    return found


OUTCOME_CLASSES = frozenset(OUTCOME_VALUES)


def outcome_badge(outcome: str) -> str:
    """The outcome as a coloured badge that says its word (the colour is never the only sign)."""
    css = outcome if outcome in OUTCOME_CLASSES else "other"
    return format_html('<span class="audit-outcome audit-outcome-{}">{}</span>', css, outcome)


def credential_label(kind: str, credential_id: str, name: str) -> str:
    return f"{kind}:{name or credential_id}" if kind else ""


def filter_link(params: dict[str, list[str]], param: str, value: str, text: str) -> str:
    """`text` as a link to the list filtered by `param`=`value` (that filter replaced, the others kept)."""
    return format_html('<a href="{}" class="audit-filter-link">{}</a>', query(params, **{param: [value]}), text)


def tool_cell(params: dict[str, list[str]]) -> Callable[[AuditRecord], str]:
    @admin.display(description="tool")
    def tool(record: AuditRecord) -> str:
        return filter_link(params, "tool", record.tool, record.tool) if record.tool else ""

    return tool  # the column's CSS class is field-<the function's name>


def credential_cell(params: dict[str, list[str]]) -> Callable[[AuditRecord], str]:
    @admin.display(description="credential, user")
    def credential(record: AuditRecord) -> str:
        label = credential_label(record.credential_kind, record.credential_id, record.credential_name)
        value = f"{record.credential_kind}:{record.credential_id}"
        shown = filter_link(params, "credential", value, label) if record.credential_kind else ""
        if not record.username:
            return shown
        user = filter_link(params, "user", record.username, record.username)
        return format_html('{}<span class="audit-user">{}</span>', shown, user)

    return credential


def recent_filter_choices(request: HttpRequest) -> dict[str, Any]:
    """The tools, credentials and users the filter bar's menus offer: those of the recent calls."""
    rows = recent_calls(request)
    credentials = sorted({row[2:] for row in rows if row[2]})
    return {
        "tools": sorted({row[0] for row in rows if row[0]}),
        "users": sorted({row[1] for row in rows if row[1]}),
        "credentials": [
            (f"{kind}:{id_}", f"{name} ({kind} #{id_})" if name else f"{kind} #{id_}")
            for kind, id_, name in credentials
        ],
    }


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnlyAuditAdmin):
    """The calls: one row per started record, with its finished record joined. Filtered by audit.filters (the
    bar above the list), not by the admin's one-value list filters."""

    # The user is shown in the credential's cell, under it: one column less to fit a 1280 px window.
    list_display = [
        "time", "tool", "arguments_summary", "credential", "call_outcome", "call_failure", "duration", "call_exit_code",
        "call_redacted",
    ]  # fmt: skip
    list_filter = ()
    # Only shows the search box: get_search_results does the searching, the same way as the exports.
    search_fields = ["arguments", "finished_record__result_excerpt"]
    search_help_text = "Words in the arguments or the result excerpt."

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditRecord]:
        return call_queryset().order_by("-id")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CallChangeList

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        params = param_lists(request.GET)
        linked: dict[str, Callable[[AuditRecord], str]] = {
            "tool": tool_cell(params),
            "credential": credential_cell(params),
        }
        return [linked.get(name, name) if isinstance(name, str) else name for name in self.list_display]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[AuditRecord], search_term: str
    ) -> tuple[QuerySet[AuditRecord], bool]:
        found = search_calls(queryset, search_term)
        floor = search_floor(request, search_term)
        request.audit_search_floor = floor  # type: ignore[attr-defined]  # for the note under the search box
        return (found.filter(id__gt=floor) if floor else found), False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        try:
            call_filters(request)
        except InvalidFilter as error:
            return invalid_filter_page(request, error, self.admin_site.each_context(request))
        params = request.GET.copy()
        for name in ("p", "o", "e", "all", SEARCH_ALL_PARAM):
            params.pop(name, None)
        bar = filter_bar(param_lists(request.GET), **recent_filter_choices(request))
        context = {
            "title": "Tool calls",
            "audit_export_query": params.urlencode(),
            "audit_filter_bar": bar,
            "audit_time_zone": timezone.get_current_timezone_name(),
            **(extra_context or {}),
        }
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
        """The arguments in a line and, under them, the agent's description of the command when it gave one."""
        summary = argument_summary(record.arguments)
        described = agent_description(record.arguments)
        if not described:
            return summary
        if len(described) > LIST_DESCRIPTION_CHARS:
            described = shorten(described, LIST_DESCRIPTION_CHARS)
        return format_html(  # the classes of the call page's description (audit.css): the agent's words, in italics
            '{}<span class="agent-says audit-described"><span class="agent-says-label">agent says:</span> {}</span>',
            summary,
            described,
        )

    @admin.display(description="credential")
    def credential(self, record: AuditRecord) -> str:
        return credential_label(record.credential_kind, record.credential_id, record.credential_name)

    @admin.display(description="outcome")
    def call_outcome(self, record: AuditRecord) -> str:
        finished = finished_of(record)
        return outcome_badge(finished.outcome if finished else OUTCOME_RUNNING)

    @admin.display(description="why it failed", empty_value="")  # no "-" in every row of a call that did not fail
    def call_failure(self, record: AuditRecord) -> str:
        return failure_line(finished_of(record))

    @admin.display(description="duration")
    def duration(self, record: AuditRecord) -> str:
        """How long the call took and, under it, a link to its replay when it has a recording."""
        finished = finished_of(record)
        shown = format_duration(finished.duration_ms) if finished else ""
        if not has_recording(record, finished):
            return shown
        url = reverse("admin:audit_auditrecord_change", args=[record.pk]) + "#recording"
        return format_html(
            '{}<a class="audit-replay" href="{}" title="Replay what the call printed">▶ replay</a>', shown, url
        )

    @admin.display(description="redacted")
    def call_redacted(self, record: AuditRecord) -> str:
        """Where redaction masked a span (arguments, result), so a reviewer knows the text shown is not all of it."""
        return ", ".join(redacted_in(record, finished_of(record)))

    @admin.display(description="exit code")
    def call_exit_code(self, record: AuditRecord) -> int | None:
        finished = finished_of(record)
        return finished.exit_code if finished else None


def invalid_filter_page(request: HttpRequest, error: InvalidFilter, site_context: dict[str, Any]) -> HttpResponse:
    """A 400 page that says which parameter is wrong and why, with the list without it."""
    params = param_lists(request.GET)
    context = {
        **site_context,
        "title": "Tool calls: a filter is wrong",
        "parameter": error.parameter,
        "message": error.message,
        "without_url": query(params, **{error.parameter: None}),
        "opts": AuditRecord._meta,
    }
    return TemplateResponse(request, "admin/audit/auditrecord/invalid_filter.html", context, status=400)
