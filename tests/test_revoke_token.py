"""`manage.py revoke_token`: one token by id, name or prefix; a name or prefix two tokens share is refused."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from oauth.models import BearerToken
from oauth.tokens import issue_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def users() -> tuple[Any, Any]:
    make = get_user_model().objects.create_user
    return make("alice", password="alice-password-1"), make("bob", password="bob-password-12")


def unrevoked(name: str) -> list[int]:
    return sorted(BearerToken.objects.filter(name=name, revoked_at__isnull=True).values_list("pk", flat=True))


def revoke(key: str) -> str:
    out = StringIO()
    call_command("revoke_token", key, stdout=out)
    return out.getvalue()


def test_a_key_two_active_tokens_share_is_refused_with_the_candidates(users: tuple[Any, Any]) -> None:
    # Names are unique among unrevoked tokens, but a name may be another token's prefix.
    alice, bob = users
    first, _ = issue_token(alice, "laptop")
    second, _ = issue_token(bob, first.prefix)
    with pytest.raises(CommandError) as refused:
        revoke(first.prefix)
    message = str(refused.value)
    assert "nothing was revoked" in message and "Pass the id" in message
    for token, owner in ((first, "alice"), (second, "bob")):
        assert f"id {token.pk}: '{token.name}', {token.prefix}…, owner {owner}, created " in message
    assert BearerToken.objects.filter(revoked_at__isnull=True).count() == 2

    assert "Revoked 1 token" in revoke(str(second.pk))
    assert unrevoked(first.prefix) == []
    assert "Revoked 1 token" in revoke(first.prefix), "one left: the key is no longer ambiguous"
    assert unrevoked("laptop") == []
    assert "revoked already" in revoke(first.prefix)


def test_a_single_match_by_name_or_prefix_is_revoked(users: tuple[Any, Any]) -> None:
    alice, _ = users
    by_name, _ = issue_token(alice, "laptop")
    by_prefix, _ = issue_token(alice, "phone")
    assert "Revoked 1 token" in revoke("laptop")
    assert "Revoked 1 token" in revoke(by_prefix.prefix)
    assert unrevoked("laptop") == [] and unrevoked("phone") == []
    with pytest.raises(CommandError, match="no token matches"):
        revoke("nothing-like-it")


def test_an_expired_namesake_does_not_make_the_working_token_ambiguous(users: tuple[Any, Any]) -> None:
    alice, _ = users
    current, _ = issue_token(alice, "ci")
    old, _ = issue_token(alice, current.prefix)
    BearerToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(days=1))
    assert f"id {current.pk}" in revoke(current.prefix)
    assert unrevoked("ci") == [] and unrevoked(old.name) == [old.pk]


def test_an_id_names_its_token_even_if_a_token_is_named_like_it(users: tuple[Any, Any]) -> None:
    alice, _ = users
    target, _ = issue_token(alice, "target")
    namesake, _ = issue_token(alice, str(target.pk))
    assert f"id {target.pk}" in revoke(str(target.pk))
    assert unrevoked("target") == [] and unrevoked(namesake.name) == [namesake.pk]
