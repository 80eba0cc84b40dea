"""The filters of the call list: one definition, shared by the admin's list, its CSV and JSON Lines exports and the
`audit_export` command, so that a filtered view, its download and its export all hold the same calls.

Every filter is a GET parameter, so a filtered view is a URL that can be shared and reloaded. Repeating a parameter
selects several values (`?outcome=error&outcome=timeout`, `?tool=a&tool=b`); `outcome=failed` stands for every
outcome but ok, `exit_code=nonzero` for every exit code but 0. The date parameters narrow together: `range` (today,
yesterday, 7d, 30d: whole days in the current time zone, today included), `since` and `until` (YYYY-MM-DD, both days
included) and `created_at__gte` and `created_at__lt` (a date or an ISO date-time, as the overview's links write
them). An empty value (an unfilled form field) is no filter; anything else that is not understood is an
InvalidFilter naming the parameter.

Each filter names the kind of record it reads, so the database can use the partial indexes of audit.models: tool,
user, credential and session on the started record, the outcome (an IN over its values) on the finished one. The
exit code, which has no index, is read from each call's finished record as the list walks the calls newest first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Q, QuerySet, Transform
from django.utils import timezone
from django.utils.datastructures import MultiValueDict
from django.utils.dateparse import parse_date, parse_datetime

from audit.models import KIND_FINISHED, OUTCOME_OK, OUTCOME_PENDING, OUTCOMES, AuditRecord

OUTCOME_RUNNING = "running"  # a started record with no finished record (yet)
OUTCOME_FAILED = "failed"  # every outcome but ok and pending (a call that waits for approval has not failed)
FAILED_OUTCOMES = tuple(outcome for outcome in OUTCOMES if outcome not in (OUTCOME_OK, OUTCOME_PENDING))
OUTCOME_VALUES = (OUTCOME_FAILED, *OUTCOMES, OUTCOME_RUNNING)

# range value -> (label, first day, day after the last), days counted from today in the current time zone
RANGES: dict[str, tuple[str, int, int]] = {
    "today": ("Today", 0, 1),
    "yesterday": ("Yesterday", -1, 0),
    "7d": ("Past 7 days", -6, 1),
    "30d": ("Past 30 days", -29, 1),
}

SEARCH_PARAM = "q"
# The changelist's own parameters (page, ordering, error flag, show all, facets, search all records): they select
# nothing. (An export always searches all records.)
PASSIVE_PARAMS = frozenset({"p", "o", "e", "all", "_facets", "search_all"})
VALUE_FILTERS = (
    "tool", "outcome", "exit_code", "user", "credential", "credential_kind", "credential_name", "session",
)  # fmt: skip
DATE_FILTERS = ("range", "since", "until", "created_at__gte", "created_at__lt")
FILTER_PARAMS = (*VALUE_FILTERS, *DATE_FILTERS)
DAY_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}")
EXIT_CODE_NONZERO = "nonzero"  # every exit code but 0 (a call without one, such as file_read's, has none to match)
EXIT_CODE_PATTERN = re.compile(r"-?\d{1,10}")
EXIT_CODE_LIMIT = 2**31  # the column is a 32-bit integer

Params = MultiValueDict[str, str] | Mapping[str, str | Sequence[str]]


class InvalidFilter(ValueError):
    """A query parameter that names no filter, or a value a filter cannot use. `parameter` is its name."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


def param_lists(params: Params) -> dict[str, list[str]]:
    """Every parameter with all its values (a QueryDict's repeated parameters included), in the order given."""
    if isinstance(params, MultiValueDict):
        return {name: list(values) for name, values in params.lists()}
    return {name: [value] if isinstance(value, str) else list(value) for name, value in params.items()}


class Unindexed(Transform):
    """The column as it is, but on SQLite hidden from the query planner (`+column`, SQLite's own idiom).

    A date filter on the calls would otherwise read its range from the (kind, created_at) index that the overview
    counts with, and sort the range by id to show the newest page: seconds for a month of a million records, where
    walking the calls newest first and stopping after a page takes a millisecond.
    """

    lookup_name = "unindexed"

    def as_sql(self, compiler: Any, connection: Any, *args: Any, **extra_context: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.lhs)
        return sql, list(params)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.lhs)
        return f"+{sql}", list(params)


AuditRecord._meta.get_field("created_at").register_lookup(Unindexed)


def start_of(day: date) -> datetime:
    """Midnight at the start of `day` in the current time zone."""
    return timezone.make_aware(datetime.combine(day, time()))


def parse_moment(value: str, parameter: str = "date") -> datetime:
    """A date or a date and time (as the admin's date links write them); naive values are in the current zone."""
    try:
        moment = parse_datetime(value.strip())
        day = None if moment is not None else parse_date(value.strip())
    except ValueError:  # well formed but impossible, such as 2025-02-30
        moment = day = None
    if moment is None:
        if day is None:
            raise InvalidFilter(parameter, f"{value!r} is not a date (YYYY-MM-DD) or a date and time")
        return start_of(day)
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def parse_day(value: str, parameter: str) -> date:
    try:
        if DAY_PATTERN.fullmatch(value.strip()):
            return date.fromisoformat(value.strip())
    except ValueError:
        pass
    raise InvalidFilter(parameter, f"{value!r} is not a date written YYYY-MM-DD")


def _one(parameter: str, values: list[str]) -> str:
    if len(set(values)) > 1:
        raise InvalidFilter(parameter, f"takes one value, not {len(set(values))}")
    return values[0]


def _outcome(queryset: QuerySet[AuditRecord], values: Sequence[str]) -> QuerySet[AuditRecord]:
    finished: set[str] = set()
    for value in values:
        if value not in OUTCOME_VALUES:
            raise InvalidFilter("outcome", f"{value!r} is not one of {', '.join(OUTCOME_VALUES)}")
        finished |= set(FAILED_OUTCOMES) if value == OUTCOME_FAILED else {value} - {OUTCOME_RUNNING}
    # Naming the kind lets the database read the outcome from its index, which holds finished records only.
    chosen = [outcome for outcome in OUTCOMES if outcome in finished]
    by_outcome = Q(finished_record__kind=KIND_FINISHED) & (
        Q(finished_record__outcome=chosen[0]) if len(chosen) == 1 else Q(finished_record__outcome__in=chosen)
    )
    if OUTCOME_RUNNING not in values:
        return queryset.filter(by_outcome)
    running = Q(finished_record__isnull=True)
    return queryset.filter(running | by_outcome if chosen else running)


def exit_codes(values: Sequence[str]) -> tuple[set[int], bool]:
    """The whole numbers among `values` and whether `nonzero` is one of them; InvalidFilter for anything else."""
    codes: set[int] = set()
    nonzero = False
    for value in values:
        text = value.strip()
        if text == EXIT_CODE_NONZERO:
            nonzero = True
        elif EXIT_CODE_PATTERN.fullmatch(text) and -EXIT_CODE_LIMIT <= int(text) < EXIT_CODE_LIMIT:
            codes.add(int(text))
        else:
            raise InvalidFilter(
                "exit_code", f"{value!r} is not a whole number (such as 1 or 127) or {EXIT_CODE_NONZERO}"
            )
    return codes, nonzero


def _exit_code(queryset: QuerySet[AuditRecord], values: Sequence[str]) -> QuerySet[AuditRecord]:
    codes, nonzero = exit_codes(values)
    if nonzero:
        by_code = Q(finished_record__exit_code__lt=0) | Q(finished_record__exit_code__gt=0)
        if 0 in codes:  # "0 or nonzero": any exit code at all
            by_code |= Q(finished_record__exit_code=0)
    else:
        chosen = sorted(codes)
        by_code = (
            Q(finished_record__exit_code=chosen[0]) if len(chosen) == 1 else Q(finished_record__exit_code__in=chosen)
        )
    # No index of its own: like the outcome, the list reads it from each call's finished record as it walks the calls
    # newest first (the plan of tests/test_audit_filters.py); a common code fills a page soon, a rare one reads on.
    return queryset.filter(Q(finished_record__kind=KIND_FINISHED) & by_code)


def _credential(queryset: QuerySet[AuditRecord], values: Sequence[str]) -> QuerySet[AuditRecord]:
    matches = Q()
    for value in values:
        kind, separator, credential_id = value.partition(":")
        if not separator:
            raise InvalidFilter("credential", f"{value!r} is not written kind:id (such as bearer:3)")
        matches |= Q(credential_kind=kind, credential_id=credential_id)
    return queryset.filter(matches)


def _column(column: str) -> Callable[[QuerySet[AuditRecord], Sequence[str]], QuerySet[AuditRecord]]:
    def by_column(queryset: QuerySet[AuditRecord], values: Sequence[str]) -> QuerySet[AuditRecord]:
        distinct = list(dict.fromkeys(values))
        return queryset.filter(**{column: distinct[0]} if len(distinct) == 1 else {f"{column}__in": distinct})

    return by_column


VALUE_FILTER_QUERIES: dict[str, Callable[[QuerySet[AuditRecord], Sequence[str]], QuerySet[AuditRecord]]] = {
    "tool": _column("tool"),
    "outcome": _outcome,
    "exit_code": _exit_code,
    "user": _column("username"),
    "credential": _credential,
    "credential_kind": _column("credential_kind"),
    # The name a credential had in its calls: an OAuth client's label is the same for each of its access tokens
    # (a new one, a new credential id, at every refresh), so its calls are found by it.
    "credential_name": _column("credential_name"),
    "session": _column("session_id"),
}


@dataclass(frozen=True)
class CallFilters:
    """The filters of one set of parameters, read and checked: `values` of the VALUE_FILTERS, and the time window
    every date parameter narrows (`start` included, `end` excluded)."""

    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    start: datetime | None = None
    end: datetime | None = None

    def apply(self, queryset: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        for name, chosen in self.values.items():
            queryset = VALUE_FILTER_QUERIES[name](queryset, chosen)
        if self.start is not None:
            queryset = queryset.filter(created_at__unindexed__gte=self.start)
        if self.end is not None:
            queryset = queryset.filter(created_at__unindexed__lt=self.end)
        return queryset


def parse_filters(params: Params, *, now: datetime | None = None) -> CallFilters:
    """The filters among `params` (the search and the passive parameters are left out); InvalidFilter if one is
    unknown or has a value it cannot use."""
    today = timezone.localdate(now)
    values: dict[str, tuple[str, ...]] = {}
    starts: list[datetime] = []
    ends: list[datetime] = []
    since = until = None
    for name, given in param_lists(params).items():
        if name in PASSIVE_PARAMS or name == SEARCH_PARAM:
            continue
        if name not in FILTER_PARAMS:
            raise InvalidFilter(name, f"no such filter (the filters are {', '.join(FILTER_PARAMS)})")
        chosen = [value for value in given if value.strip()]
        if not chosen:
            continue
        if name in VALUE_FILTERS:
            values[name] = tuple(chosen)
            VALUE_FILTER_QUERIES[name](AuditRecord.objects.none(), chosen)  # checks the values now, not when run
        elif name == "range":
            key = _one(name, chosen)
            if key not in RANGES:
                raise InvalidFilter(name, f"{key!r} is not one of {', '.join(RANGES)}")
            _, first, after = RANGES[key]
            starts.append(start_of(today + timedelta(days=first)))
            ends.append(start_of(today + timedelta(days=after)))
        elif name == "since":
            since = parse_day(_one(name, chosen), name)
            starts.append(start_of(since))
        elif name == "until":
            until = parse_day(_one(name, chosen), name)
            ends.append(start_of(until + timedelta(days=1)))
        elif name == "created_at__gte":
            starts += [parse_moment(value, name) for value in chosen]
        else:
            ends += [parse_moment(value, name) for value in chosen]
    if since is not None and until is not None and until < since:
        raise InvalidFilter("until", f"{until} is before since ({since})")
    return CallFilters(values, max(starts, default=None), min(ends, default=None))


def apply_filters(queryset: QuerySet[AuditRecord], params: Params) -> QuerySet[AuditRecord]:
    """`queryset` narrowed by the filters among `params` (not the search: see audit.export.filter_calls)."""
    return parse_filters(params).apply(queryset)
