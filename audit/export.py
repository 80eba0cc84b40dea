"""Calls as export rows: the filtered queryset (the filters of audit.filters and the search, shared by the admin's
changelist, its CSV and JSON Lines exports and the `audit_export` command), one dict per call, and its CSV and JSON
Lines forms."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils.text import smart_split, unescape_string_literal

from audit.filters import OUTCOME_RUNNING, SEARCH_PARAM, Params, apply_filters, param_lists
from audit.models import KIND_STARTED, REDACTED_KEY, AuditRecord
from audit.visible import escape_json_text, make_visible

EXPORT_CHUNK_SIZE = 2000

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


def call_queryset() -> QuerySet[AuditRecord]:
    """Every call: its started record with the finished record joined, oldest first."""
    return AuditRecord.objects.filter(kind=KIND_STARTED).select_related("finished_record").order_by("id")


def finished_of(started: AuditRecord) -> AuditRecord | None:
    try:
        return started.finished_record
    except AuditRecord.DoesNotExist:
        return None


# --- filters and search -----------------------------------------------------------------------------------------


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


def filter_calls(queryset: QuerySet[AuditRecord], params: Params) -> QuerySet[AuditRecord]:
    """`queryset` narrowed by changelist query parameters (`request.GET`, repeated parameters included) and its
    search; raises InvalidFilter on a parameter it cannot use (audit.filters)."""
    queryset = apply_filters(queryset, params)
    for query in param_lists(params).get(SEARCH_PARAM, []):
        queryset = search_calls(queryset, query)
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
