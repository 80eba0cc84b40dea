from __future__ import annotations

import os
import pwd
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from mcpserver.executor import landlock
from mcpserver.start_check import add_accept_argument, run_before_start
from oauth.claude_code import claude_code_line
from oauth.models import BearerToken
from oauth.tokens import import_bootstrap_token, issue_token, shell_actor

ADMIN_USERNAME = "admin"
FIRST_TOKEN_NAME = "first-run"
# Marks the banner lines that hold a secret shown once (`manage.py run` keeps a banner with them if the server fails).
SHOWN_ONCE = "<- shown once"


def manage_hint() -> str:
    """How the operator runs manage.py here: through sandstorm-manage on an installed server (which has a separate
    tool executor), from the checkout's virtualenv under `make run`."""
    return "sudo sandstorm-manage" if settings.EXECUTOR_SOCKET else ".venv/bin/python manage.py"


class Command(BaseCommand):
    help = (
        "Prepare a server to run: check the database (refusing, in one line, one that lost audit records or is "
        "damaged or missing where one was), migrate it, create the workspace, and on first run create the admin "
        "user and a bearer token (each secret printed once). Safe to re-run: it then prints no secret."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-migrate", action="store_true", help="skip migrations")
        add_accept_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        # Before the migrations, which would create a new database where one is missing (mcpserver.start_check).
        run_before_start(options["accept_audit_loss"], self.stderr)
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        if not settings.EXECUTOR_SOCKET:  # with a separate executor, the workspace is the agent user's to make
            settings.WORKSPACE_ROOT.mkdir(exist_ok=True)
        with transaction.atomic():
            password = self.ensure_admin()
            token = self.ensure_token()
        self.report(password, token)

    def ensure_admin(self) -> str | None:
        """Create the admin user on first run; the generated password, or None if it was not generated now."""
        users = get_user_model().objects
        if users.filter(username=ADMIN_USERNAME).exists():
            return None
        given = settings.ADMIN_PASSWORD
        password = given or secrets.token_urlsafe(15)
        users.create_superuser(ADMIN_USERNAME, email="", password=password)
        return None if given else password

    def ensure_token(self) -> str | None:
        """Import SANDSTORM_MCP_TOKEN, or issue a first token when none exists. The new secret, or None."""
        admin = get_user_model().objects.get(username=ADMIN_USERNAME)
        if settings.MCP_BOOTSTRAP_TOKEN:
            try:
                import_bootstrap_token(admin, settings.MCP_BOOTSTRAP_TOKEN)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            return None
        if BearerToken.objects.exists():
            return None
        return issue_token(admin, FIRST_TOKEN_NAME, by=shell_actor())[1]

    def report(self, password: str | None, token: str | None) -> None:
        write = self.stdout.write
        manage = manage_hint()
        write("")
        write("Sandstorm is ready.")
        write(f"  Admin:      {settings.PUBLIC_URL}/admin/  (user: {ADMIN_USERNAME})")
        if password:
            write(f"  Password:   {password}   {SHOWN_ONCE}; change it in the admin")
        elif not settings.ADMIN_PASSWORD:
            write(f"  Password:   the one printed on first run (reset it: {manage} changepassword {ADMIN_USERNAME})")
        write(f"  MCP URL:    {settings.MCP_RESOURCE_URL}")
        write(f"  Workspace:  {settings.WORKSPACE_ROOT}")
        if not settings.EXECUTOR_SOCKET:
            write(f"  Tools run:  {development_confinement(pwd.getpwuid(os.getuid()).pw_name)}")
        require = (
            "required of every staff user"
            if settings.REQUIRE_SECOND_FACTOR
            else "offered at sign-in; to require it of every staff user: SANDSTORM_REQUIRE_SECOND_FACTOR=1"
        )
        write(f"  2FA:        {require}")
        if token:
            write(f"  Token:      {token}   {SHOWN_ONCE} (named {FIRST_TOKEN_NAME!r}); only its hash is stored")
        elif not settings.MCP_BOOTSTRAP_TOKEN:
            write(f"  Token:      the one printed on first run, or a new one: {manage} create_token NAME")
        shown = token or ("<the value of SANDSTORM_MCP_TOKEN>" if settings.MCP_BOOTSTRAP_TOKEN else "<your token>")
        write("")
        write("Connect Claude Code (for all your projects; it replaces an earlier 'sandstorm' entry):")
        write(f"  {claude_code_line(settings.MCP_RESOURCE_URL, shown)}")
        write("")


def development_confinement(user: str) -> str:
    """The banner's line on who runs the tools in development, and whether the kernel keeps them in the workspace."""
    own = f"as '{user}', the server's own OS user"
    if settings.CONFINEMENT_DEFAULT == "host":
        return f"{own}, profile 'host' (SANDSTORM_CONFINEMENT): agents can read its keys (README, Security model)"
    why_not = kernel_refusal()
    if why_not is None:
        return (
            f"{own}, confined to the workspace by default (profile 'workspace', kernel-enforced): agents cannot "
            "read the server's keys or edit its code"
        )
    if settings.CONFINEMENT_DEFAULT_CHOSEN:
        return f"{own}; profile 'workspace' cannot be enforced here ({why_not}): such calls are refused"
    return f"{own}, unconfined: {why_not}; agents can read its keys (README, Security model)"


def kernel_refusal() -> str | None:
    """Why this kernel cannot confine tools (the executor runs on the same kernel), or None if it can."""
    if settings.KERNEL_CONFINEMENT == "off":
        return "kernel confinement turned off (SANDSTORM_KERNEL_CONFINEMENT=off)"
    try:
        landlock.abi_version()
    except landlock.LandlockUnavailable as error:
        return str(error)
    return None
