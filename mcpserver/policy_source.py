"""Where the command policy lives: its rules and settings in the database (mcpserver.models), read into a
`Policy` (mcpserver.policy) that each server process caches.

The cache is keyed by `PolicySettings.version`, which every change bumps. A change made in this process (the
console) applies to the next call; a change another process made (`manage.py policy_load`, another worker) is
seen within `RECHECK_SECONDS`, the interval at which a process looks at the version. One row read a second,
instead of one a call, keeps the policy's per-call cost to the evaluation itself.

A policy document is the JSON `Policy.to_dict()` writes, each rule optionally with `"enabled": false`. Stored
rules are checked again when they are read: one that no longer reads (a downgrade, a hand-edited row) makes the
whole policy deny every call with that reason, rather than silently dropping a rule that may have been a deny.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, transaction
from django.utils import timezone

from mcpserver.models import PolicyRule, PolicySettings
from mcpserver.policy.recommended import RECOMMENDED
from mcpserver.policy.rules import Policy, PolicyError, Rule

logger = logging.getLogger(__name__)
RECHECK_SECONDS = 1.0
RECOMMENDED_IDS = frozenset(rule["id"] for rule in RECOMMENDED)
_RECOMMENDED_SPECS = {rule["id"]: Rule.from_dict(rule).to_dict() for rule in RECOMMENDED}


def is_recommended(rule: Rule) -> bool:
    """Whether a rule is one of the recommended set as shipped (not an admin's rule of the same id)."""
    return _RECOMMENDED_SPECS.get(rule.id) == rule.to_dict()


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Policy
    version: int
    broken: str = ""  # why the stored policy cannot be used (then every call is denied with this reason)

    @property
    def needs_git_roots(self) -> bool:
        return any(pattern.when == "outside-repos" for rule in self.policy.rules for pattern in rule.commands)

    @property
    def allows_everything(self) -> bool:
        """Today's behaviour: no rule, everything allowed (the evaluation can be skipped)."""
        return not self.broken and not self.policy.rules and self.policy.default == "allow"


def policy_version() -> int:
    return PolicySettings.objects.filter(pk=1).values_list("version", flat=True).first() or 0


def load_policy() -> LoadedPolicy:
    """The stored policy (enabled rules, in order), read in one transaction so the version matches the rules."""
    with transaction.atomic():
        settings_row = PolicySettings.objects.filter(pk=1).first()
        rows = list(PolicyRule.objects.filter(enabled=True).order_by("position", "id"))
    version = settings_row.version if settings_row else 0
    document: dict[str, Any] = {"rules": [row.spec for row in rows]}
    if settings_row is not None:
        document["default"] = settings_row.default
        if settings_row.opaque:
            document["opaque"] = settings_row.opaque
    try:
        return LoadedPolicy(Policy.from_dict(document), version)
    except PolicyError as error:
        logger.error("the stored command policy cannot be used, so every call is denied: %s", error)
        return LoadedPolicy(Policy(default="deny"), version, broken=f"the command policy cannot be read ({error})")


class PolicyCache:
    """This process's copy of the policy. Used on the event loop; `forget` may be called from any thread."""

    def __init__(self) -> None:
        self._loaded: LoadedPolicy | None = None
        self._checked = 0.0

    async def current(self) -> LoadedPolicy:
        loaded, now = self._loaded, time.monotonic()
        if loaded is not None and now - self._checked < RECHECK_SECONDS:
            return loaded
        try:
            version = await sync_to_async(policy_version)()
            if loaded is None or version != loaded.version:
                loaded = await sync_to_async(load_policy)()
                self._loaded = loaded
        except DatabaseError:
            if loaded is None:
                raise  # no policy known: the call is refused (mcpserver.dispatch)
            # A dropped connection fails its query once and is replaced (sandstorm_site/postgresql): the policy
            # read a moment ago decides this call, and the next one looks again.
            logger.warning("could not read the command policy's version; the policy read before decides")
            return loaded
        self._checked = now
        return loaded

    def forget(self) -> None:
        self._loaded = None

    def users_may_approve(self) -> bool:
        """Whether the policy last read has a rule letting the client's own user approve (no database read; before
        the first read, perhaps)."""
        loaded = self._loaded
        return loaded is None or any(rule.approver == "user" for rule in loaded.policy.rules)


POLICY = PolicyCache()


# --- documents ---------------------------------------------------------------------------------------------------


def check_document(document: object) -> tuple[Policy, list[bool]]:
    """The policy a document holds and each rule's `enabled`; PolicyError names what is wrong."""
    if not isinstance(document, Mapping):
        raise PolicyError("policy: must be an object")
    rules = document.get("rules", [])
    if not isinstance(rules, list):
        raise PolicyError("policy: rules: must be a list of rules")
    enabled: list[bool] = []
    plain_rules = []
    for index, rule in enumerate(rules):
        if isinstance(rule, Mapping) and "enabled" in rule:
            if not isinstance(rule["enabled"], bool):
                raise PolicyError(f"rules[{index}]: enabled: must be true or false")
            enabled.append(rule["enabled"])
            rule = {key: value for key, value in rule.items() if key != "enabled"}
        else:
            enabled.append(True)
        plain_rules.append(rule)
    return Policy.from_dict({**document, "rules": plain_rules}), enabled


def policy_document() -> dict[str, Any]:
    """The stored policy as a document, disabled rules included (what `policy_export` writes)."""
    settings_row = PolicySettings.objects.filter(pk=1).first()
    document: dict[str, Any] = {"default": settings_row.default if settings_row else "allow"}
    if settings_row is not None and settings_row.opaque:
        document["opaque"] = settings_row.opaque
    document["rules"] = [rule_entry(row) for row in PolicyRule.objects.order_by("position", "id")]
    return document


def rule_entry(row: PolicyRule) -> dict[str, Any]:
    """A stored rule as policy documents and audit records show it (a disabled one says so)."""
    return row.spec if row.enabled else {**row.spec, "enabled": False}


# The order Rule.to_dict() writes, whatever order the database kept the keys in (PostgreSQL's jsonb sorts them).
RULE_KEYS = ("id", "decision", "who", "tools", "commands", "paths", "description", "approver", "enabled")
WHO_KEYS = ("users", "credentials", "clients", "scopes")


def _in_order(mapping: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    known = [key for key in order if key in mapping]
    return {key: mapping[key] for key in known + sorted(key for key in mapping if key not in order)}


def document_text(document: dict[str, Any]) -> str:
    """A policy document as the export writes it (and the console's "Download as JSON" serves it)."""
    rules = []
    for rule in document.get("rules", []):
        if isinstance(rule, dict):  # a stored spec that is not a rule is exported as it is, for an admin to fix
            rule = _in_order(rule, RULE_KEYS)
            if isinstance(rule.get("who"), dict):
                rule["who"] = _in_order(rule["who"], WHO_KEYS)
        rules.append(rule)
    return json.dumps({**document, "rules": rules}, indent=2, ensure_ascii=False) + "\n"


def replace_policy(document: object, by: str) -> Policy:
    """Replace the stored policy with a document's, all or nothing. Raises PolicyError and changes nothing if the
    document is not a valid policy."""
    policy, enabled = check_document(document)
    with transaction.atomic():
        PolicyRule.objects.all().delete()
        now = timezone.now()
        PolicyRule.objects.bulk_create(
            PolicyRule(
                position=(index + 1) * 10,
                rule_id=rule.id,
                spec=rule.to_dict(),
                enabled=on,
                recommended=is_recommended(rule),
                updated_at=now,
                updated_by=by,
            )
            for index, (rule, on) in enumerate(zip(policy.rules, enabled, strict=True))
        )
        settings_row = _locked_settings()
        settings_row.default = policy.default
        settings_row.opaque = policy.opaque or ""
        _bump(settings_row, by)
    POLICY.forget()
    return policy


def bump_version(by: str) -> None:
    """Record that the stored rules changed (call inside the transaction that changed them)."""
    _bump(_locked_settings(), by)
    transaction.on_commit(POLICY.forget)


def _locked_settings() -> PolicySettings:
    PolicySettings.objects.get_or_create(pk=1)
    return PolicySettings.objects.select_for_update().get(pk=1)


def _bump(settings_row: PolicySettings, by: str) -> None:
    settings_row.version += 1
    settings_row.updated_at = timezone.now()
    settings_row.updated_by = by
    settings_row.save()


def stored_rule(spec: object) -> Rule:
    """A rule as the console saves it: checked alone (PolicyError names what is wrong)."""
    return Rule.from_dict(spec)
