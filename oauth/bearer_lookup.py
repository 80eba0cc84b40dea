"""The SQL that finds a bearer token by its hash, compiled from BearerToken.objects at start-up.

Every request at /mcp looks its token up, and building the query through the ORM each time would cost more CPU
than running it. So the two queries below are compiled to SQL once per database, from the one definition of a
valid token (BearerTokenQuerySet.in_force and valid), with stand-ins for the values of a request (the hash, the
present moment, the start of the last-use window) that are put in place by position for each request. Nothing here
restates what makes a token valid: change `in_force()` or `valid()` and both queries follow.

The authoritative query finds a token in force, suspended or not, so that a suspended token is refused saying so
with no second query (the row carries `suspended_at`); the shortcut's finds valid tokens only, leaving a suspended
one to the authoritative lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, QuerySet

from oauth.models import BearerToken

# Values no request can have, recognised among the compiled query's parameters.
DIGEST_STAND_IN = "\x00token hash\x00"
NOW_STAND_IN = datetime(1900, 1, 1, 0, 0, 1, tzinfo=UTC)
USED_SINCE_STAND_IN = datetime(1900, 1, 1, 0, 0, 2, tzinfo=UTC)
# The columns of a steady token, in this order: oauth.steady_tokens.SteadyToken and then the hash.
STEADY_COLUMNS = ("id", "name", "scope", "user_id", "user_username", "confinement", "token_hash")


def _by_hash(tokens: QuerySet[BearerToken], digest: str) -> QuerySet[BearerToken]:
    """The token among `tokens` with this hash, with its user's name as `user_username`."""
    username = get_user_model().USERNAME_FIELD
    return tokens.filter(token_hash=digest).annotate(user_username=F(f"user__{username}")).order_by()


def bearer_in_force(digest: str, now: datetime) -> QuerySet[BearerToken]:
    """The token in force (valid, or suspended) with this hash at `now`."""
    return _by_hash(BearerToken.objects.in_force(now), digest)


def steady_bearer(digest: str, now: datetime, used_since: datetime) -> QuerySet[BearerToken]:
    """The valid token with this hash, if last used after `used_since`: a token whose use needs no write (never
    used: no row)."""
    return _by_hash(BearerToken.objects.valid(now).filter(last_used_at__gt=used_since), digest)


@dataclass(frozen=True)
class CompiledLookup:
    """A query compiled for one database: its SQL (`%s` placeholders) and how to fill in its parameters."""

    sql: str
    template: tuple[Any, ...]  # the compiled parameters, stand-ins included
    slots: tuple[tuple[int, str], ...]  # (position in the parameters, "digest" / "now" / "used_since")
    adapt_datetime: Callable[[datetime], Any]

    def params(self, digest: str, now: datetime, used_since: datetime | None = None) -> list[Any]:
        values = {"digest": digest, "now": self.adapt_datetime(now)}
        if used_since is not None:
            values["used_since"] = self.adapt_datetime(used_since)
        params = list(self.template)
        for position, name in self.slots:
            params[position] = values[name]
        return params


def compile_lookup(queryset: QuerySet[Any], database: BaseDatabaseWrapper, expected: frozenset[str]) -> CompiledLookup:
    """Compile `queryset`, built from the stand-ins, for `database`. Raises RuntimeError unless each stand-in named
    in `expected` comes out as a parameter of its own (else a request's values could not be put in place)."""
    sql, params = queryset.query.get_compiler(connection=database).as_sql()
    adapt = database.ops.adapt_datetimefield_value
    stand_ins = {"digest": DIGEST_STAND_IN, "now": adapt(NOW_STAND_IN), "used_since": adapt(USED_SINCE_STAND_IN)}
    slots = tuple(
        (position, name) for position, value in enumerate(params) for name, stand_in in stand_ins.items()
        if type(value) is type(stand_in) and value == stand_in
    )  # fmt: skip
    if {name for _, name in slots} != expected:
        raise RuntimeError(f"the bearer token query did not compile to the expected parameters: {params!r}")
    return CompiledLookup(sql=sql, template=tuple(params), slots=slots, adapt_datetime=adapt)


def compile_bearer_in_force(database: BaseDatabaseWrapper) -> CompiledLookup:
    """The authoritative lookup's query: the token in force by hash, as a model row (BearerToken.objects.raw)."""
    return compile_lookup(bearer_in_force(DIGEST_STAND_IN, NOW_STAND_IN), database, frozenset({"digest", "now"}))


def compile_steady_bearer(database: BaseDatabaseWrapper) -> CompiledLookup:
    """The shortcut's query: the token in steady use by hash, as STEADY_COLUMNS."""
    queryset = steady_bearer(DIGEST_STAND_IN, NOW_STAND_IN, USED_SINCE_STAND_IN).values_list(*STEADY_COLUMNS)
    return compile_lookup(queryset, database, frozenset({"digest", "now", "used_since"}))
