"""The audit log's read-only admin lists, fast on millions of records: they never count the table (a page is fetched
with one row more, which says whether an older page exists), never sort by anything but the primary key, and build
their filter choices from the newest records only. Nobody, superusers included, may add, change or delete a record.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.contrib.auth import get_permission_codename
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import capfirst

from audit.models import AuditRecord

# Filter choices come from this many newest records: a DISTINCT over the whole table would read all of it.
RECENT_RECORDS = 20_000
SEARCH_ALL_PARAM = "search_all"
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
        # Titled in words ("Security events"), not Django's "Select security event to view".
        title = capfirst(str(self.opts.verbose_name_plural))
        response = super().changelist_view(request, {"title": title, **(extra_context or {})})
        context = getattr(response, "context_data", None)
        changelist = context.get("cl") if context else None
        if context and isinstance(changelist, ChangeList):
            context.update(page_links(changelist))
        return response

    @admin.display(description="time")
    def time(self, record: AuditRecord) -> str:
        moment = timezone.localtime(record.created_at)
        return format_html('{} <span class="audit-clock">{}</span>', f"{moment:%Y-%m-%d}", f"{moment:%H:%M:%S %Z}")


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
