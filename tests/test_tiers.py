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
