"""The console's lists of credentials and approvals (oauth.admin, oauth.admin_clients, mcpserver.admin_approvals),
readable in a 1280 px window without scrolling sideways.

Django's list puts its filters in a 240 px column beside the rows; with the console's navigation on the left, that
left the rows about 630 px. These lists show their filters as compact rows above the rows instead (the audit list's
filter bar, audit/audit.css), combine what belongs together into one cell, print a date with the time under it,
and are titled in words rather than "Select bearer token to change".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.text import capfirst

CHANGE_LIST_TEMPLATE = "admin/console_change_list.html"


@dataclass(frozen=True)
class FilterRow:
    """One filter of a list, as the bar above it shows it: its title and its choices (Django's `selected`,
    `query_string` and `display` of each)."""

    title: str
    choices: list[Mapping[str, object]]


def filter_rows(changelist: ChangeList) -> list[FilterRow]:
    return [FilterRow(str(spec.title), list(spec.choices(changelist))) for spec in changelist.filter_specs]


class ConsoleList(admin.ModelAdmin):
    """A list of the console: titled by its model's plural name, its filters in a bar above the rows."""

    change_list_template = CHANGE_LIST_TEMPLATE
    show_facets = admin.ShowFacets.NEVER  # a count per choice is a query per choice, and the bar has no room for it

    class Media:
        css = {"all": ["oauth/credentials.css"]}

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        title = capfirst(str(self.opts.verbose_name_plural))
        response = super().changelist_view(request, {"title": title, **(extra_context or {})})
        context = getattr(response, "context_data", None)
        changelist = context.get("cl") if context else None
        if context is not None and isinstance(changelist, ChangeList):
            context["filter_rows"] = filter_rows(changelist)
        return response


def moment(value: datetime | None, empty: str = "—") -> str:
    """A date and time in the console's one format (DATETIME_FORMAT: sandstorm_site/formats), in the server's time
    zone and naming it, the time and zone under the date."""
    if value is None:
        return empty
    text = date_format(timezone.localtime(value), "DATETIME_FORMAT")
    day, _, clock = text.partition(" ")
    return format_html('<span class="list-moment">{} <span class="list-clock">{}</span></span>', day, clock)


def status_badge(status: str) -> str:
    """A status as a word in a coloured badge (oauth/static/oauth/credentials.css): the colour is never alone."""
    return format_html(
        '<span class="credential-status credential-status-{}">{}</span>', status, status.replace("_", " ")
    )


def two_lines(first: object, second: object) -> str:
    """A cell of two facts, the second quieter and under the first (an owner and a credential, a tool and its
    command)."""
    if not second:
        return format_html("{}", first)
    return format_html('{}<span class="list-second">{}</span>', first, second)
