"""`manage.py suspend_token`, `resume_token`, `suspend_app` and `resume_app`: what the console's pages do, from the
shell, recorded as the command line's; re-running changes nothing."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone
from oauth2_provider.models import Application

from audit.models import AuditRecord
from oauth.models import AppSuspension, BearerToken, Revocation
from oauth.tokens import issue_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice")


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_a_token_is_suspended_and_resumed_from_the_shell(alice: Any) -> None:
    token, _ = issue_token(alice, "laptop")
    assert "Suspended token" in run("suspend_token", "laptop", "--stop-background")
    assert "suspended already" in run("suspend_token", token.prefix)
    assert BearerToken.objects.get().suspended_at is not None
    assert [r.stop_background for r in Revocation.objects.all()] == [True]
    assert "Resumed token" in run("resume_token", str(token.pk))
    assert "was not suspended" in run("resume_token", "laptop")
    assert BearerToken.objects.get().suspended_at is None
    events = AuditRecord.objects.filter(event__in=["token.suspended", "token.resumed"]).order_by("id")
    assert [(r.event, r.credential_kind) for r in events] == [("token.suspended", "shell"), ("token.resumed", "shell")]


def test_a_revoked_or_ambiguous_token_is_refused(alice: Any) -> None:
    first, _ = issue_token(alice, "laptop")
    issue_token(alice, first.prefix)
    with pytest.raises(CommandError, match="nothing was suspended. Pass the id of the one to suspend"):
        run("suspend_token", first.prefix)
    BearerToken.objects.filter(pk=first.pk).update(revoked_at=timezone.now())
    with pytest.raises(CommandError, match="is revoked"):
        run("suspend_token", str(first.pk))
    assert not BearerToken.objects.filter(suspended_at__isnull=False).exists()


def test_an_app_is_suspended_for_every_user_or_one_and_resumed_apart(alice: Any) -> None:
    app = Application.objects.create(
        name="Claude", client_type="public", authorization_grant_type="authorization-code",
        redirect_uris="https://app.example/cb",
    )  # fmt: skip
    assert "for every user" in run("suspend_app", app.client_id)
    assert "for alice" in run("suspend_app", str(app.pk), "--user", "alice")
    assert "already" in run("suspend_app", app.client_id, "--user", "alice")
    assert sorted(AppSuspension.objects.values_list("user_id", flat=True), key=str) == sorted([None, alice.pk], key=str)
    assert "Resumed" in run("resume_app", app.client_id)
    assert list(AppSuspension.objects.values_list("user_id", flat=True)) == [alice.pk]
    assert "Resumed" in run("resume_app", app.client_id, "--user", "alice")
    assert not AppSuspension.objects.exists()
    with pytest.raises(CommandError, match="no connected app"):
        run("suspend_app", "nope")
    with pytest.raises(CommandError, match="no user named"):
        run("suspend_app", app.client_id, "--user", "nobody")
