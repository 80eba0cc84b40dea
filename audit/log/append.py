"""The SQL of an append: the chain head locked (or created, for an empty chain), the records inserted, the head moved.

`append_in` is the one body of an append, on any DB-API cursor in a transaction its caller holds: the writer's on
Django's connection (`append_all`), and the caller-thread appender's on a SQLite connection of its own. Both convert
values through Django's fields, so a row is the same whichever connection wrote it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import CharField, TextField
from django.db.models.constants import OnConflict

from audit.log.chain import GENESIS_MAC
from audit.log.encoding import CHAINED_FIELDS, JSON_FIELDS, Mac, canonical_bytes, record_values
from audit.models import KIND_FINISHED, KIND_STARTED, AuditRecord, ChainHead
from audit.storable import storable_json, storable_text


def make_storable(record: AuditRecord) -> None:
    """Put `record`'s content in the form the database gives back, so its mac verifies on every database."""
    for name in CHAINED_FIELDS:
        value = getattr(record, name)
        if name in JSON_FIELDS:
            setattr(record, name, storable_json(value))
        elif isinstance(value, str):
            setattr(record, name, storable_text(value))


@dataclass(frozen=True)
class Statements:
    """The statements of an append, written once as plain SQL rather than compiled by the ORM for each record."""

    head: str
    create_head: str
    insert: str
    update: str
    returning: bool

    def with_placeholder(self, placeholder: str) -> Statements:
        """The same statements for a DB-API connection whose parameter style is not Django's `%s` (sqlite3: `?`)."""
        return Statements(
            self.head.replace("%s", placeholder),
            self.create_head.replace("%s", placeholder),
            self.insert.replace("%s", placeholder),
            self.update.replace("%s", placeholder),
            self.returning,
        )


_INSERTED = tuple(field for field in AuditRecord._meta.concrete_fields if not field.primary_key)
# Text columns store a str exactly as given (CharField and TextField only turn other values into str), so theirs skip
# the field's conversion; every other value still goes through it.
_TEXT = tuple(isinstance(field, CharField | TextField) for field in _INSERTED)


def db_values(record: AuditRecord, database: BaseDatabaseWrapper) -> list[Any]:
    """The INSERT's parameters for `record`: field.get_db_prep_save(field.pre_save(record, True)) of each field."""
    values = []
    for field, text in zip(_INSERTED, _TEXT, strict=True):
        value = getattr(record, field.attname)
        if not (text and type(value) is str):
            value = field.get_db_prep_save(field.pre_save(record, True), database)
        values.append(value)
    return values


def statements_for(database: BaseDatabaseWrapper) -> Statements:
    quote = database.ops.quote_name
    records, heads = quote(AuditRecord._meta.db_table), quote(ChainHead._meta.db_table)
    lock = " FOR UPDATE" if database.features.has_select_for_update else ""
    returning = bool(database.features.can_return_columns_from_insert)
    columns = ", ".join(quote(field.column) for field in _INSERTED)
    insert = f"INSERT INTO {records} ({columns}) VALUES ({', '.join(['%s'] * len(_INSERTED))})"
    # The head of an empty chain, as lock_head() makes it: whoever inserts second waits for the first to commit,
    # then inserts nothing and locks the first one's row.
    create_head = (
        f"{database.ops.insert_statement(on_conflict=OnConflict.IGNORE)} {heads} "
        f"({quote('id')}, {quote('mac')}, {quote('last_record_id')}) VALUES (1, %s, 0) "
        + database.ops.on_conflict_suffix_sql([], OnConflict.IGNORE, None, None)  # no fields: any conflict
    ).strip()
    return Statements(
        head=f"SELECT {quote('mac')} FROM {heads} WHERE {quote('id')} = 1{lock}",
        create_head=create_head,
        insert=insert + (f" RETURNING {quote('id')}" if returning else ""),
        update=f"UPDATE {heads} SET {quote('mac')} = %s, {quote('last_record_id')} = %s WHERE {quote('id')} = 1",
        returning=returning,
    )


@functools.cache
def _statements(vendor: str) -> Statements:
    return statements_for(connection)


@functools.lru_cache(maxsize=4)
def _keyed(key: bytes) -> Mac:
    return Mac(key)


def append_all(records: Sequence[AuditRecord]) -> None:
    """Insert `records`, in order, at the head of the chain in one transaction on Django's connection (inside the
    caller's transaction, if there is one); each gets its id, prev_mac and mac."""
    if not records:
        return
    for record in records:
        make_storable(record)
    with transaction.atomic(), connection.cursor() as cursor:
        append_in(cursor, records, _statements(connection.vendor), connection)
    saved(records, connection.alias)


def append_in(
    cursor: Any, records: Sequence[AuditRecord], statements: Statements, database: BaseDatabaseWrapper
) -> None:
    """The statements of an append of storable records, on `cursor`, in a transaction the caller holds and ends.

    A finished record whose started record has no id yet (a read's two records, appended together) follows that
    record in `records` and gets its id here, before its mac covers it.

    Writers serialize on the ChainHead row, so the chain cannot fork. Holding the lock until commit also means
    records commit in id order, so a reader that has seen record N has seen every record before it. `database`
    converts each value as the ORM would for that database (no query: only its operations are used).
    """
    cursor.execute(statements.head)
    row = cursor.fetchone()
    if row is None:
        cursor.execute(statements.create_head, [GENESIS_MAC])
        cursor.execute(statements.head)
        row = cursor.fetchone()
    prev_mac = row[0]
    keyed = _keyed(settings.AUDIT_HMAC_KEY)
    started_ids: dict[str, int] = {}  # a read's started record, by call id, for its finished record in this append
    for record in records:
        if record.kind == KIND_FINISHED and record.started_id is None:
            record.started_id = started_ids[record.call_id]
        record.prev_mac = prev_mac
        record.mac = prev_mac = keyed.hexdigest(canonical_bytes(record_values(record), prev_mac))
        cursor.execute(statements.insert, db_values(record, database))
        if statements.returning:
            record.id = cursor.fetchone()[0]
        else:
            record.id = database.ops.last_insert_id(cursor, AuditRecord._meta.db_table, "id")
        if record.kind == KIND_STARTED:
            started_ids[record.call_id] = record.id
    cursor.execute(statements.update, [prev_mac, records[-1].id])


def saved(records: Sequence[AuditRecord], alias: str) -> None:
    """Mark committed records as the ORM marks the rows it saved."""
    for record in records:
        record._state.adding = False
        record._state.db = alias
