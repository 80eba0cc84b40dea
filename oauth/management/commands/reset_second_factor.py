"""Remove a user's second factor (a lost phone): their TOTP devices and recovery codes. They sign in with the
password alone again, and are offered the set-up anew (or must set it up, with SANDSTORM_REQUIRE_SECOND_FACTOR)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django_otp import devices_for_user
from django_otp.plugins.otp_static.models import StaticDevice

from audit.log import event
from oauth.second_factor import required_for_everyone
from oauth.tokens import shell_actor


def describe(device: Any) -> str:
    state = "confirmed" if device.confirmed else "not confirmed"
    if isinstance(device, StaticDevice):
        return f"recovery codes '{device.name}' ({device.token_set.count()} unused, {state})"
    return f"authenticator app '{device.name}' ({state})"


class Command(BaseCommand):
    help = (
        "Remove every second-factor device of a user (authenticator app and recovery codes), e.g. after a lost "
        "phone. Recorded in the audit log with your OS user."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="the user whose second factor to remove")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        with transaction.atomic():
            devices = list(devices_for_user(user, confirmed=None))
            removed = [describe(device) for device in devices]
            for device in devices:
                device.delete()
        if not removed:
            self.stdout.write(f"{username} has no second factor: nothing removed.")
            return
        event("admin.second_factor_reset", shell_actor(), user=username, removed=removed)
        for line in removed:
            self.stdout.write(f"Removed {line} of {username}.")
        then = "must set up a new one" if required_for_everyone() else "is offered the set-up again"
        self.stdout.write(f"{username} now signs in with the password and {then}.")
