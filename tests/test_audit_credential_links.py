"""The audit admin links a call's credential to the pages its owning app registered (its page, its revocation)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.urls import reverse

from audit import credential_links
from audit.credential_links import credential_link, register_credential_link, revoke_link


@pytest.fixture
def registry() -> Iterator[None]:
    before, revokes = dict(credential_links._links), dict(credential_links._revoke_links)
    yield
    credential_links._links.clear()
    credential_links._links.update(before)
    credential_links._revoke_links.clear()
    credential_links._revoke_links.update(revokes)


def test_oauth_registers_the_bearer_token_page_at_start_up() -> None:
    assert credential_link("bearer", "7") == reverse("admin:oauth_bearertoken_change", args=["7"])


def test_a_bearer_id_that_is_not_a_number_has_no_page() -> None:
    assert credential_link("bearer", "7/../../delete") is None


def test_a_kind_nobody_registered_has_no_page() -> None:
    assert credential_link("device", "3") is None
    assert credential_link("", "") is None


def test_a_registered_kind_links_through_its_own_function(registry: None) -> None:
    register_credential_link("device", lambda credential_id: f"/devices/{credential_id}/")
    assert credential_link("device", "9") == "/devices/9/"


def test_oauth_registers_the_bearer_token_revoke_confirmation() -> None:
    assert revoke_link("bearer", "7") == reverse("admin:oauth_bearertoken_revoke", args=["7"])
    assert revoke_link("bearer", "7/../delete") is None


def test_a_kind_registered_without_a_revoke_page_has_none(registry: None) -> None:
    register_credential_link("device", lambda credential_id: f"/devices/{credential_id}/")
    assert revoke_link("device", "9") is None
    register_credential_link("device", str, revoke=lambda credential_id: f"/devices/{credential_id}/revoke/")
    assert revoke_link("device", "9") == "/devices/9/revoke/"
