"""Regenerating a bearer token (oauth.tokens.regenerate_token) and `manage.py regenerate_token NAME|ID|PREFIX`: a new
secret with the same name, owner, scope, profile, expiry and suspension; the old one revoked through the revocation
path (recorded, its running calls cancelled, its background processes left running unless asked); by `revoke_token`'s
lookup rules."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit.models import AuditRecord
from oauth.models import BearerToken, Revocation, hash_token
from oauth.suspension import suspend_token
from oauth.tokens import NotRegenerable, issue_token, regenerate_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice")


def details(event: str) -> list[dict[str, Any]]:
    return [dict(record.detail or {}) for record in AuditRecord.objects.filter(event=event).order_by("id")]


def regenerate(key: str, *options: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("regenerate_token", key, *options, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_new_token_keeps_name_owner_scope_profile_and_expiry_and_the_old_is_revoked(alice: Any) -> None:
    old, _ = issue_token(alice, "laptop", scope="mcp", expires_days=10, confinement="host")
    before, new, secret = regenerate_token(old.pk, None)
    old.refresh_from_db()
    assert old.revoked_at is not None and before.pk == old.pk
    assert (new.name, new.user_id, new.scope, new.confinement, new.expires_at) == (
        "laptop", alice.pk, "mcp", "host", old.expires_at,
    )  # fmt: skip
    assert new.pk != old.pk and new.token_hash == hash_token(secret) and new.prefix != old.prefix
    assert new.revoked_at is None and new.suspended_at is None


def test_the_old_token_is_revoked_through_the_revocation_path_and_both_are_recorded(alice: Any) -> None:
    old, _ = issue_token(alice, "laptop")
    _, new, _ = regenerate_token(old.pk, None)
    [revocation] = Revocation.objects.all()
    assert (revocation.reason, revocation.keys, revocation.stop_background) == (
        Revocation.REASON_REGENERATION, [f"bearer:{old.pk}"], False,
    )  # fmt: skip
    assert [detail["token_id"] for detail in details("token.revoked")] == [old.pk]
    [detail] = details("token.regenerated")
    assert detail == {
        "token_id": new.pk, "name": "laptop", "prefix": new.prefix, "owner": "alice", "scope": "mcp",
        "confinement": "", "default": detail["default"], "previous_token_id": old.pk,
        "previous_prefix": old.prefix, "stop_background": False,
    }  # fmt: skip


def test_stopping_the_background_processes_is_asked_for_not_assumed(alice: Any) -> None:
    old, _ = issue_token(alice, "laptop")
    regenerate_token(old.pk, None, stop_background=True)
    assert Revocation.objects.get().stop_background is True


def test_a_suspended_token_stays_suspended_under_its_new_secret(alice: Any) -> None:
    old, _ = issue_token(alice, "laptop")
    suspend_token(old, None)
    _, new, _ = regenerate_token(old.pk, None)
    assert new.suspended_at is not None and new.status == "suspended"


def test_a_revoked_or_expired_token_is_not_regenerated(alice: Any) -> None:
    gone, _ = issue_token(alice, "gone")
    BearerToken.objects.filter(pk=gone.pk).update(revoked_at=timezone.now())
    with pytest.raises(NotRegenerable, match="revoked"):
        regenerate_token(gone.pk, None)
    old, _ = issue_token(alice, "old")
    BearerToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    with pytest.raises(NotRegenerable, match="expired"):
        regenerate_token(old.pk, None)
    assert BearerToken.objects.count() == 2 and not Revocation.objects.exists()


# --- the command -----------------------------------------------------------------------------------------------------


def test_the_command_prints_the_new_secret_alone_on_stdout(alice: Any) -> None:
    old, _ = issue_token(alice, "laptop")
    out, err = regenerate(old.prefix)
    new = BearerToken.objects.get(name="laptop", revoked_at__isnull=True)
    assert out.strip() == out.strip().splitlines()[-1] and new.token_hash == hash_token(out.strip())
    assert "Regenerated token 'laptop' for alice" in err and f"{old.prefix}…, id {old.pk}) is revoked" in err
    assert out.strip() not in err, "the secret is printed once"
    assert AuditRecord.objects.get(event="token.regenerated").credential_kind == "shell"


def test_the_command_finds_tokens_as_revoke_token_does(alice: Any) -> None:
    bob = get_user_model().objects.create_user("bob")
    first, _ = issue_token(alice, "laptop")
    issue_token(bob, first.prefix)  # a name may be another token's prefix
    with pytest.raises(CommandError, match="nothing was regenerated. Pass the id of the one to regenerate"):
        regenerate(first.prefix)
    assert not Revocation.objects.exists()
    regenerate(str(first.pk))
    with pytest.raises(CommandError, match="was revoked: create a new one"):
        regenerate(str(first.pk))
    with pytest.raises(CommandError, match="no token matches"):
        regenerate("nothing-like-it")


def test_the_command_refuses_an_expired_token(alice: Any) -> None:
    old, _ = issue_token(alice, "old")
    BearerToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    with pytest.raises(CommandError, match="has expired"):
        regenerate("old")


def test_the_stop_background_option_is_passed_on(alice: Any) -> None:
    issue_token(alice, "laptop")
    regenerate("laptop", "--stop-background")
    assert Revocation.objects.get().stop_background is True
