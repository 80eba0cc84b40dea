"""Appending records to the chain: three plain SQL statements in one transaction, on any connection.

`append_all` runs them on Django's connection (the group-commit writer, and synchronous writers); `append_in` is
their one body, which audit.inline also runs on a connection of its own. Both convert values through Django's
fields, so a row is the same whichever connection wrote it.
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

from audit.chain import CHAINED_FIELDS, JSON_FIELDS, Mac, canonical_bytes, lock_head, record_values
from audit.models import AuditRecord, ChainHead
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
    """The three statements of an append, written once: compiling them through the ORM cost more CPU than running
    them (the ORM's select_for_update, save and update were two thirds of an append)."""

    head: str
    insert: str
    update: str
    returning: bool

    def with_placeholder(self, placeholder: str) -> Statements:
        """The same statements for a DB-API connection whose parameter style is not Django's `%s` (sqlite3: `?`)."""
        return Statements(
            self.head.replace("%s", placeholder),
            self.insert.replace("%s", placeholder),
            self.update.replace("%s", placeholder),
            self.returning,
        )


_INSERTED = tuple(field for field in AuditRecord._meta.concrete_fields if not field.primary_key)
# Text columns store a str exactly as given (CharField and TextField only turn other values into str), so theirs skip
# the field's conversion, which was most of an append's Python work; every other value still goes through it.
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
    return Statements(
        head=f"SELECT {quote('mac')} FROM {heads} WHERE {quote('id')} = 1{lock}",
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
    """Insert `records`, in order, at the head of the chain in one transaction; each gets its id, prev_mac and mac.

    Writers serialize on the ChainHead row, so the chain cannot fork. Holding the lock until commit also means
    records commit in id order, so a reader that has seen record N has seen every record before it. The statements
    are lock_head(), save() per record and one update() of the head, as plain SQL.
    """
    if not records:
        return
    for record in records:
        make_storable(record)
    statements = _statements(connection.vendor)
    with transaction.atomic(), connection.cursor() as cursor:
        if not append_in(cursor, records, statements, connection):
            lock_head()  # an empty chain: the ORM path creates the head row
            append_in(cursor, records, statements, connection)
    saved(records, connection.alias)


def append_in(cursor: Any, records: Sequence[AuditRecord], statements: Statements, database: BaseDatabaseWrapper) -> bool:
    """The statements of an append of storable records, on `cursor`, in a transaction the caller holds and ends.

    False, with nothing written, if the chain has no head row yet. `database` converts each value as the ORM would
    for that database (no query: only its operations are used).
    """
    cursor.execute(statements.head)
    row = cursor.fetchone()
    if row is None:
        return False
    prev_mac = row[0]
    keyed = _keyed(settings.AUDIT_HMAC_KEY)
    for record in records:
        record.prev_mac = prev_mac
        record.mac = prev_mac = keyed.hexdigest(canonical_bytes(record_values(record), prev_mac))
        cursor.execute(statements.insert, db_values(record, database))
        if statements.returning:
            record.id = cursor.fetchone()[0]
        else:
            record.id = database.ops.last_insert_id(cursor, AuditRecord._meta.db_table, "id")
    cursor.execute(statements.update, [prev_mac, records[-1].id])
    return True


def saved(records: Sequence[AuditRecord], alias: str) -> None:
    """Mark committed records as the ORM marks the rows it saved."""
    for record in records:
        record._state.adding = False
        record._state.db = alias
