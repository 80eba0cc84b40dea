"""`manage.py policy_load FILE`: replace the stored command policy with a JSON document (what `policy_export`
writes), all of it or nothing. `--dry-run` checks the document and says what would change."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from audit.log import event
from mcpserver.policy.rules import Policy, PolicyError
from mcpserver.policy_source import check_document, policy_document, policy_version, replace_policy
from mcpserver.process import INSTANCE_ID
from oauth.tokens import shell_actor

LOADED_BY = "manage.py policy_load"


def read_source(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(source).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {source}: {error.strerror or error}") from None


def parse(data: bytes, source: str) -> tuple[object, Policy, list[bool]]:
    """The document and the policy it holds; CommandError naming what is wrong."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CommandError(f"{source}: not a JSON document ({error}); nothing was changed") from None
    try:
        policy, enabled = check_document(document)
    except PolicyError as error:
        raise CommandError(f"{source}: {error}; nothing was changed") from None
    return document, policy, enabled


def rule_entries(policy: Policy, enabled: list[bool]) -> dict[str, dict[str, Any]]:
    """Each rule in the form policy_document() gives it, by id."""
    return {
        rule.id: rule.to_dict() if on else {**rule.to_dict(), "enabled": False}
        for rule, on in zip(policy.rules, enabled, strict=True)
    }


@dataclass(frozen=True)
class Changes:
    """What loading a document would change, against the stored policy."""

    added: list[str]
    removed: list[str]
    changed: list[str]
    reordered: bool
    settings: list[str]

    def lines(self) -> list[str]:
        return (
            [f"add rule {rule_id}" for rule_id in self.added]
            + [f"remove rule {rule_id}" for rule_id in self.removed]
            + [f"change rule {rule_id}" for rule_id in self.changed]
            + (["reorder the rules"] if self.reordered else [])
            + [f"change the {setting}" for setting in self.settings]
        )

    def summary(self, nothing: str) -> str:
        counts = [(len(self.added), "added"), (len(self.removed), "removed"), (len(self.changed), "changed")]
        parts = [f"{number} {what}" for number, what in counts if number]
        parts += (["reordered"] if self.reordered else []) + self.settings
        return ", ".join(parts) or nothing


def changes(current: dict[str, Any], policy: Policy, enabled: list[bool]) -> Changes:
    old = {rule.get("id"): rule for rule in current["rules"] if isinstance(rule, dict)}
    new = rule_entries(policy, enabled)
    settings = []
    if current["default"] != policy.default:
        settings.append(f"default {current['default']} -> {policy.default}")
    if current.get("opaque") != policy.opaque:
        settings.append(f"opaque {current.get('opaque') or 'automatic'} -> {policy.opaque or 'automatic'}")
    return Changes(
        added=[rule_id for rule_id in new if rule_id not in old],
        removed=[str(rule_id) for rule_id in old if rule_id not in new],
        changed=[rule_id for rule_id in new if rule_id in old and old[rule_id] != new[rule_id]],
        reordered=[rule_id for rule_id in old if rule_id in new] != [rule_id for rule_id in new if rule_id in old],
        settings=settings,
    )


class Command(BaseCommand):
    help = (
        "Replace the stored command policy with a JSON policy document (as policy_export writes it; FILE or - for "
        "standard input). The whole document is checked first: a rule that does not read stops the load and "
        "nothing changes. Running servers apply it to their next call (within a second). --dry-run only says what "
        "would change."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the policy document, or - to read standard input")
        parser.add_argument("--dry-run", action="store_true", help="check the document and list the changes only")

    def handle(self, *args: Any, **options: Any) -> None:
        source = options["file"]
        name = "standard input" if source == "-" else source
        data = read_source(source)
        document, policy, enabled = parse(data, name)
        found = changes(policy_document(), policy, enabled)
        counts = f"{len(policy.rules)} rule{'s' if len(policy.rules) != 1 else ''} ({sum(enabled)} enabled)"
        if options["dry_run"]:
            for line in found.lines():
                self.stdout.write(f"  would {line}")
            self.stdout.write(
                f"Dry run: {name} holds {counts} ({found.summary('the same as the stored policy')}); nothing was changed."
            )
            return
        with transaction.atomic():  # the audit record commits with the policy, or neither does
            replace_policy(document, by=LOADED_BY)
            version = policy_version()
            event(
                "policy.loaded",
                shell_actor(),
                instance_id=INSTANCE_ID,
                rule_ids=[rule.id for rule in policy.rules],
                version=version,
                sha256=hashlib.sha256(data).hexdigest(),
                source=name,
                changes=found.lines(),
            )
        self.stdout.write(
            f"Loaded {counts} from {name}: policy version {version} ({found.summary('no change but the version')})."
        )
