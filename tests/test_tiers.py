"""The suite's tiers (tests/tiers.py): exactly one per test, from its marker or its fixtures, enforced when it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tiers


@pytest.mark.parametrize(
    ("markers", "fixtures", "tier"),
    [
        (set(), {"tmp_path"}, "unit"),
        (set(), {"mcp_app"}, "inprocess"),
        (set(), {"live_server", "mcp_app"}, "live"),
        ({"browser"}, set(), "live"),
        ({"inprocess"}, {"tmp_path"}, "inprocess"),
        ({"live"}, {"mcp_app"}, "live"),
    ],
)
def test_a_test_gets_its_marker_or_the_tier_its_fixtures_imply(
    markers: set[str], fixtures: set[str], tier: str
) -> None:
    assert tiers.tier_of(markers, fixtures) == tier


@pytest.mark.parametrize(
    ("markers", "fixtures"),
    [({"unit", "live"}, set()), ({"unit"}, {"live_server"}), ({"inprocess"}, {"browser"}), ({"unit"}, {"mcp_app"})],
)
def test_two_tiers_or_a_marker_below_what_the_fixtures_need_is_refused(markers: set[str], fixtures: set[str]) -> None:
    with pytest.raises(ValueError, match="tier"):
        tiers.tier_of(markers, fixtures)


def test_a_unit_test_that_makes_a_live_server_is_stopped(tmp_path: Path) -> None:
    from tests.live import make_server

    assert tiers.current == "unit"
    with pytest.raises(AssertionError, match="mark it `live`"):
        make_server(tmp_path)


@pytest.mark.parametrize(
    ("tier", "markers", "fixtures", "same"),
    [
        ("unit", set(), {"tmp_path"}, True),
        ("unit", {"django_db"}, set(), False),
        ("unit", set(), {"db"}, False),
        ("unit", set(), {"transactional_db"}, False),
        ("inprocess", set(), {"mcp_app", "transactional_db"}, False),
        ("live", set(), {"live_server"}, False),
        ("live", set(), {"tmp_path"}, False),  # a live test may start a server, which takes DATABASE_URL
        ("live", {"same_on_any_database"}, {"tmp_path"}, True),
    ],
)
def test_only_tests_that_reach_no_database_or_say_so_are_the_same_on_any_database(
    tier: str, markers: set[str], fixtures: set[str], same: bool
) -> None:
    assert tiers.same_on_any_database(tier, markers, fixtures) is same


def test_this_process_refuses_a_test_marked_same_on_any_database_the_database(
    request: pytest.FixtureRequest,
) -> None:
    from django.contrib.auth.models import User

    assert request.node.get_closest_marker("same_on_any_database") is not None
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        User.objects.count()
