"""The suite's three tiers, one marker each: `unit` (no server), `inprocess` (the /mcp application driven in this
process, tests/inprocess.py) and `live` (a real Daphne, an installer, Caddy or a browser; `browser` is a kind of
live). `make test-fast` runs the first two, `make test` all three.

Every test gets exactly one tier, at collection (tests/conftest.py): a tier marker it carries, else the tier of the
fixtures it uses, else `unit`. A test that starts a server without saying so is stopped when it tries (`require`).

Across the tiers, `slow` marks what is slow by nature, not by the way it is written: the installer's full runs, the
bench's smoke run, damaged databases, several server processes behind one Caddy or Redis. `make test` leaves those
out; `make test-slow` runs them alone and `.ci/run` runs both.
"""

from __future__ import annotations

TIERS = ("unit", "inprocess", "live")
# Fixtures that make a test live (they start servers or a browser), and those that make it in-process.
LIVE_FIXTURES = frozenset(
    {"live_server", "oauth_server", "browser", "admin_page", "tool_token", "tools_client", "workspace_dir", "redis_url"}
)
INPROCESS_FIXTURES = frozenset({"mcp_app"})
# pytest-django's fixtures that open this process's test database; a test without one (or a `django_db` marker) is
# refused the database.
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"})
ANY_DATABASE = "same_on_any_database"

current: str | None = None  # the tier of the test being set up or run


def tier_of(markers: set[str], fixtures: set[str]) -> str:
    """The tier of a test with these marker and fixture names; ValueError if it says more than one."""
    named = [tier for tier in TIERS if tier in markers]
    if "browser" in markers and "live" not in named:
        named.append("live")
    if len(named) > 1:
        raise ValueError(f"is marked with more than one tier: {', '.join(named)}")
    implied = "live" if fixtures & LIVE_FIXTURES else "inprocess" if fixtures & INPROCESS_FIXTURES else None
    if named and implied is not None and named[0] != implied and TIERS.index(named[0]) < TIERS.index(implied):
        raise ValueError(f"is marked {named[0]} but uses fixtures of the {implied} tier")
    return named[0] if named else implied or "unit"


def same_on_any_database(tier: str, markers: set[str], fixtures: set[str]) -> bool:
    """Whether a test's outcome cannot depend on the database the suite runs against (DATABASE_URL), so that
    `make test-postgres` may leave it out: it says so (a test that makes its own SQLite databases), or it is a unit
    test that pytest-django refuses the database. A unit test that passes this process's DATABASE_URL on to a
    process it starts depends on the database all the same: mark it `django_db`, or pass the child no DATABASE_URL."""
    if ANY_DATABASE in markers:
        return True
    return tier == "unit" and "django_db" not in markers and not fixtures & DATABASE_FIXTURES


def require(tier: str, what: str) -> None:
    """Fail the running test unless it is of `tier` (it does `what`, which only that tier may)."""
    if current is not None and current != tier and TIERS.index(current) < TIERS.index(tier):
        raise AssertionError(f"this test {what}: mark it `{tier}` (pytest.mark.{tier}); it is collected as {current}")
