"""Confinement profiles of full-scope credentials: what an agent's commands may reach, chosen per credential.

`workspace`: the kernel confines the commands (writes only in the workspace and a private temporary directory; the
server's state, keys, env files and code out of reach; setuid programs gain nothing). `host`: the agent user's full
reach, sudo where the OS allows it. A credential's own choice is "" when it leaves it to the installation's default
(settings.CONFINEMENT_DEFAULT, from SANDSTORM_CONFINEMENT). Read-only credentials have no profile: their calls run
in the strictest read sandbox whatever the setting. Whether the kernel can enforce `workspace` is the MCP server's
to decide at each call; this module only says what each credential asked for, and records who changed it.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from oauth2_provider.models import Application

from audit.log import Actor, event
from oauth.agent_identity import workspace_confinement_enforced
from oauth.credentials import application_label
from oauth.models import (
    CONFINEMENT_HOST,
    CONFINEMENT_INSTALLATION,
    CONFINEMENT_WORKSPACE,
    SCOPE_ALL,
    AppConfinement,
    BearerToken,
)

PROFILES = (CONFINEMENT_WORKSPACE, CONFINEMENT_HOST)
CHOICES = (CONFINEMENT_INSTALLATION, *PROFILES)
READ_ONLY_WORDS = "none needed: read-only, its calls always run in the strictest read sandbox"


def installation_default() -> str:
    """SANDSTORM_CONFINEMENT as it applies now: the development default, which nobody chose, falls back to `host`
    where the executor said its kernel cannot enforce `workspace` (as mcpserver.confinement_profile applies it)."""
    default = str(settings.CONFINEMENT_DEFAULT)
    if default == CONFINEMENT_WORKSPACE and not settings.CONFINEMENT_DEFAULT_CHOSEN:
        if workspace_confinement_enforced() is False:
            return CONFINEMENT_HOST
    return default


def enforcement_note(choice: str, scope: str) -> str:
    """Why a credential set to `workspace` cannot work here, if the executor said its kernel cannot enforce it."""
    if SCOPE_ALL not in scope.split() or applied(choice) != CONFINEMENT_WORKSPACE:
        return ""
    if workspace_confinement_enforced() is not False:
        return ""
    return "The kernel here cannot enforce it (see the console's home): this credential's calls are refused."


def applied(choice: str) -> str:
    """The profile a credential's choice comes to ("" is the installation's default)."""
    return choice if choice in PROFILES else installation_default()


def profile_words(profile: str, user: str) -> str:
    """What a profile lets the agent reach, in plain words; `user` is the OS user the tools run as."""
    if profile == CONFINEMENT_HOST:
        return (
            f"the full reach of {user}: every file that user may read or write anywhere on the host, "
            "and sudo where the OS allows it"
        )
    return (
        f"confined to the workspace {settings.WORKSPACE_ROOT}: commands run as {user} but write only there and in "
        "a private temporary directory; the server's state directory, keys, env files and its own code can be "
        "neither read nor written; sudo and other setuid programs gain no privileges"
    )


def choice_label(choice: str) -> str:
    """A credential's choice as a short label: "host", or "workspace (the installation's default)"."""
    if choice in PROFILES:
        return choice
    return f"{installation_default()} (the installation's default)"


def choice_line(choice: str, scope: str, user: str) -> str:
    """The "Confinement" line of a credential: its profile and what it reaches, or why a read-only one has none."""
    if SCOPE_ALL not in scope.split():
        return READ_ONLY_WORDS
    return f"{choice_label(choice)}: {profile_words(applied(choice), user)}"


def reach_words(choice: str, scope: str, user: str) -> str:
    """What a credential's commands reach, beside its badge (which names the profile)."""
    if SCOPE_ALL not in scope.split():
        return READ_ONLY_WORDS
    return profile_words(applied(choice), user)


def form_choices(user: str) -> list[tuple[str, str]]:
    """The choices of a profile field, each with what it reaches."""
    default = installation_default()
    return [
        (CONFINEMENT_INSTALLATION, f"the installation's default, now {default}"),
        (CONFINEMENT_WORKSPACE, f"workspace — {profile_words(CONFINEMENT_WORKSPACE, user)}"),
        (CONFINEMENT_HOST, f"host — {profile_words(CONFINEMENT_HOST, user)}"),
    ]


def badge(choice: str, scope: str) -> SafeString:
    """The profile as a badge in the lists and pages: a `host` credential's is a warning."""
    if SCOPE_ALL not in scope.split():
        return format_html('<span class="credential-confinement">{}</span>', "read sandbox")
    profile = applied(choice)
    title = "the agent user's full reach" if profile == CONFINEMENT_HOST else "confined to the workspace"
    return format_html(
        '<span class="credential-confinement credential-confinement-{}" title="{}">{}{}</span>',
        profile,
        title,
        "⚠ " if profile == CONFINEMENT_HOST else "",
        profile if choice in PROFILES else f"{profile} (default)",
    )


def checked(choice: str) -> str:
    if choice not in CHOICES:
        raise ValueError(
            f"a confinement profile is workspace, host or empty (the installation's default), not {choice!r}"
        )
    return choice


def change_token_confinement(token: BearerToken, choice: str, by: Actor | None) -> bool:
    """Set a bearer token's profile, recording who changed it from what to what; False if nothing changed.
    Its next call at /mcp reads the new one (every lookup reads the row)."""
    checked(choice)
    with transaction.atomic():
        current = BearerToken.objects.select_for_update().filter(pk=token.pk).values_list("confinement", flat=True)
        previous = current.first()
        if previous is None or previous == choice:
            return False
        BearerToken.objects.filter(pk=token.pk).update(confinement=choice)
        event(
            "token.confinement_changed",
            by,
            token_id=token.pk,
            name=token.name,
            prefix=token.prefix,
            owner=token.user.get_username(),
            previous=previous,
            confinement=choice,
            default=installation_default(),
        )
    token.confinement = choice
    return True


def app_confinement(application: Application, user_id: int) -> str:
    row = AppConfinement.objects.filter(application=application, user_id=user_id).first()
    return row.confinement if row else CONFINEMENT_INSTALLATION


def change_app_confinement(application: Application, user: AbstractBaseUser, choice: str, by: Actor | None) -> bool:
    """Set a connected app's profile for one user, recording who changed it from what to what; False if nothing
    changed. The app's next call as that user reads the new one (the access-token lookup joins it)."""
    checked(choice)
    with transaction.atomic():
        row, _ = AppConfinement.objects.select_for_update().get_or_create(application=application, user_id=user.pk)
        if row.confinement == choice:
            return False
        previous = row.confinement
        AppConfinement.objects.filter(pk=row.pk).update(confinement=choice, changed_at=timezone.now())
        event(
            "oauth.confinement_changed",
            by,
            client=application_label(application.name, application.client_id),
            client_id=application.client_id,
            owner=user.get_username(),
            previous=previous,
            confinement=choice,
            default=installation_default(),
        )
    return True
