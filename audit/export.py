"""Calls as export rows: the filtered queryset (one set of query parameters, shared by the admin's changelist, its
CSV and JSON Lines exports and the `audit_export` command), one dict per call, and its CSV and JSON Lines forms."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import datetime, time
from typing import Any

from django.db.models import Q, QuerySet, TextField, Transform
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.text import smart_split, unescape_string_literal

from audit.models import KIND_FINISHED, KIND_STARTED, OUTCOMES, REDACTED_KEY, AuditRecord
from audit.visible import escape_json_text, make_visible

EXPORT_CHUNK_SIZE = 2000
OUTCOME_RUNNING = "running"  # a started record with no finished record (yet)

# `command` is not a key of the row: it is the command of a terminal tool's arguments, a column of its own so that a
# spreadsheet can sort and filter on it (the full arguments are in `arguments`, as JSON).
CSV_FIELDS = (
    "call_id", "tool", "command", "started_at", "finished_at",
    "user", "credential_kind", "credential_id", "credential_name", "scope",
    "client_address", "user_agent", "session_id", "protocol_version",
    "arguments", "arguments_size", "arguments_sha256",
    "outcome", "exit_code", "duration_ms", "reason", "result_excerpt", "result_size", "result_sha256", "redacted",
)  # fmt: skip
# A spreadsheet runs a cell that starts with one of these as a formula (tab and CR are stripped before it looks).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n")

SEARCH_PARAM = "q"
# The changelist's own parameters (page, ordering, error flag, show all, facets, search all records): they select
# nothing. (An export always searches all records.)
PASSIVE_PARAMS = frozenset({"p", "o", "e", "all", "_facets", "search_all"})


class InvalidFilter(ValueError):
    """A query parameter that names no filter, or a value a filter cannot use."""


def call_queryset() -> QuerySet[AuditRecord]:
    """Every call: its started record with the finished record joined, oldest first."""
    return AuditRecord.objects.filter(kind=KIND_STARTED).select_related("finished_record").order_by("id")


def finished_of(started: AuditRecord) -> AuditRecord | None:
    try:
        return started.finished_record
    except AuditRecord.DoesNotExist:
        return None


# --- filters ---------------------------------------------------------------------------------------------------


def _by_outcome(queryset: QuerySet[AuditRecord], value: str) -> QuerySet[AuditRecord]:
    if value == OUTCOME_RUNNING:
        return queryset.filter(finished_record__isnull=True)
    if value not in OUTCOMES:
        raise InvalidFilter(f"unknown outcome {value!r}")
    # Naming the kind lets the database read the outcome from its index, which holds finished records only.
    return queryset.filter(finished_record__kind=KIND_FINISHED, finished_record__outcome=value)


def _by_credential(queryset: QuerySet[AuditRecord], value: str) -> QuerySet[AuditRecord]:
    kind, separator, credential_id = value.partition(":")
    if not separator:
        raise InvalidFilter("credential must be written kind:id")
    return queryset.filter(credential_kind=kind, credential_id=credential_id)


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


def parse_moment(value: str) -> datetime:
    """A date or a date and time (as the admin's date filter writes them); naive values are in the current zone."""
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value.strip())
        if day is None:
            raise InvalidFilter(f"not a date: {value!r}")
        moment = datetime.combine(day, time())
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


FILTERS: dict[str, Callable[[QuerySet[AuditRecord], str], QuerySet[AuditRecord]]] = {
    "tool": lambda queryset, value: queryset.filter(tool=value),
    "outcome": _by_outcome,
    "user": lambda queryset, value: queryset.filter(username=value),
    "credential": _by_credential,
    "credential_kind": lambda queryset, value: queryset.filter(credential_kind=value),
    "session": lambda queryset, value: queryset.filter(session_id=value),
    "created_at__gte": lambda queryset, value: queryset.filter(created_at__unindexed__gte=parse_moment(value)),
    "created_at__lt": lambda queryset, value: queryset.filter(created_at__unindexed__lt=parse_moment(value)),
}


def filter_by(queryset: QuerySet[AuditRecord], name: str, value: str) -> QuerySet[AuditRecord]:
    """Apply the one filter `name` (a key of FILTERS) with `value`."""
    try:
        apply = FILTERS[name]
    except KeyError:
        raise InvalidFilter(f"unknown filter {name!r}") from None
    return apply(queryset, value)


def _spellings(term: str) -> set[str]:
    # Arguments are stored as JSON text: a quote or a backslash in a string is escaped there, and on SQLite every
    # non-ASCII character too. Looking for each spelling finds the term either way.
    return {term, json.dumps(term)[1:-1], json.dumps(term, ensure_ascii=False)[1:-1]}


def search_calls(queryset: QuerySet[AuditRecord], query: str) -> QuerySet[AuditRecord]:
    """Calls whose arguments or result excerpt contain every word of `query` ("quoted phrases" kept whole)."""
    terms = [
        unescape_string_literal(bit) if bit[:1] in "\"'" and bit[-1:] == bit[:1] else bit for bit in smart_split(query)
    ]
    terms = [term for term in terms if term]
    if not terms:
        return queryset
    queryset = queryset.annotate(arguments_text=Cast("arguments", TextField()))
    for term in terms:
        matches = Q(finished_record__result_excerpt__icontains=term)
        for spelling in _spellings(term):
            matches |= Q(arguments_text__icontains=spelling)
        queryset = queryset.filter(matches)
    return queryset


def filter_calls(queryset: QuerySet[AuditRecord], params: Mapping[str, str]) -> QuerySet[AuditRecord]:
    """`queryset` narrowed by changelist query parameters (`request.GET`); raises InvalidFilter on an unknown one."""
    for name, value in params.items():
        if name in PASSIVE_PARAMS:
            continue
        if name == SEARCH_PARAM:
            queryset = search_calls(queryset, value)
        else:
            queryset = filter_by(queryset, name, value)
    return queryset


# --- rows ------------------------------------------------------------------------------------------------------


def redacted_in(record: AuditRecord, finished: AuditRecord | None) -> list[str]:
    """Where redaction masked a span in this call: argument names, and "result" for the result excerpt."""
    where: list[str] = []
    for part in (record, finished):
        detail = part.detail if part is not None and isinstance(part.detail, dict) else {}
        names = detail.get(REDACTED_KEY)
        if isinstance(names, list):
            where += [str(name) for name in names]
    return where


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def call_row(record: AuditRecord) -> dict[str, Any]:
    """One call as a JSON-serialisable dict. `record` is a started record whose finished record was joined."""
    finished = finished_of(record)
    return {
        "call_id": record.call_id,
        "tool": record.tool,
        "started_at": _iso(record.created_at),
        "finished_at": _iso(finished.created_at) if finished else None,
        "user": record.username,
        "credential_kind": record.credential_kind,
        "credential_id": record.credential_id,
        "credential_name": record.credential_name,
        "scope": record.scope,
        "client_address": record.client_address,
        "user_agent": record.user_agent,
        "session_id": record.session_id,
        "protocol_version": record.protocol_version,
        "arguments": record.arguments,
        "arguments_size": record.arguments_size,
        "arguments_sha256": record.arguments_sha256,
        "outcome": finished.outcome if finished else OUTCOME_RUNNING,
        "exit_code": finished.exit_code if finished else None,
        "duration_ms": finished.duration_ms if finished else None,
        "reason": finished.reason if finished else "",
        "result_excerpt": finished.result_excerpt if finished else "",
        "result_size": finished.result_size if finished else None,
        "result_sha256": finished.result_sha256 if finished else "",
        "redacted": redacted_in(record, finished),
    }


def export_rows(queryset: QuerySet[AuditRecord]) -> Iterator[dict[str, Any]]:
    """Rows of `queryset` (see call_queryset), read in chunks rather than all at once."""
    for record in queryset.iterator(chunk_size=EXPORT_CHUNK_SIZE):
        yield call_row(record)


async def aexport_rows(queryset: QuerySet[AuditRecord]) -> AsyncIterator[dict[str, Any]]:
    """export_rows for async code: under ASGI a streamed response must be fed by an async iterator."""
    async for record in queryset.aiterator(chunk_size=EXPORT_CHUNK_SIZE):
        yield call_row(record)


# --- formats ---------------------------------------------------------------------------------------------------


def neutralise(cell: str) -> str:
    """A cell a spreadsheet would run as a formula, made plain text with a leading apostrophe."""
    return "'" + cell if cell.startswith(FORMULA_PREFIXES) else cell


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        value = " ".join(value)  # `redacted`: the names of what was masked
    elif isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    elif not isinstance(value, str):
        return str(value)  # numbers: a negative exit code is a number, not a formula
    return make_visible(neutralise(value))


def _csv_value(row: Mapping[str, Any], name: str) -> Any:
    if name == "command" and name not in row:
        arguments = row.get("arguments")
        command = arguments.get("command") if isinstance(arguments, dict) else None
        return command if isinstance(command, str) else None
    return row.get(name)


def csv_line(row: Mapping[str, Any]) -> str:
    """One CSV record (CRLF-terminated) of the CSV_FIELDS of `row`, formula cells neutralised, control and
    bidirectional characters spelled out (audit/visible.py)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerow([_csv_cell(_csv_value(row, name)) for name in CSV_FIELDS])
    return buffer.getvalue()


CSV_HEADER = csv_line({name: name for name in CSV_FIELDS})


def jsonl_line(row: Mapping[str, Any]) -> str:
    """One JSON Lines record (newline-terminated). JSON escapes newlines and the other C0 controls inside values;
    DEL, the C1 controls and the bidirectional characters are escaped too, so no raw one reaches a terminal."""
    return escape_json_text(json.dumps(row, ensure_ascii=False, sort_keys=False, default=str)) + "\n"
