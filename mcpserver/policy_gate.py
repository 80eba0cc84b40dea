"""The command policy at the dispatch point: the facts of one call (who, what, where) and the policy's verdict.

The policy itself is pure (mcpserver.policy); this module supplies what it needs from outside: the cached policy
(mcpserver.policy_source), the agent's workspace and home (asked of the executor once), the git repositories in
the workspace (asked of the executor, only for policies with an `outside-repos` pattern, at most every
GIT_ROOTS_SECONDS), and the OAuth client id of a connected app.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from asgiref.sync import sync_to_async
from oauth2_provider.models import get_application_model

from mcpserver.executor.interface import Executor, ExecutorError
from mcpserver.policy.commands import ParsedCommand
from mcpserver.policy.evaluate import Caller, CallFacts, Verdict, evaluate
from mcpserver.policy.rules import COMMAND_TOOLS
from mcpserver.policy.shell import parse_command
from mcpserver.policy_source import POLICY, LoadedPolicy
from oauth.credentials import Principal

logger = logging.getLogger(__name__)
GIT_ROOTS_SECONDS = 5.0
ALLOW_ALL = Verdict("allow", "default", "no policy rules")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    approver: str  # of the rule that asked: "staff" or "user"
    policy_version: int
    recorded: bool = True  # False with no policy at all: the audit record then says nothing of it
    # An ask answered before this call: ("grant" or "request", the request's label, who approved it).
    answered_by: tuple[str, str, str] | None = None

    @property
    def asks(self) -> bool:
        return self.verdict.decision == "ask" and self.answered_by is None

    def answered(self, how: str, label: str, by: str) -> Decision:
        return replace(self, answered_by=(how, label, by))

    def audit_detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {
            "decision": self.verdict.decision,
            "rule": self.verdict.rule_id,
            "reason": self.verdict.reason[:500],
        }
        if self.answered_by is not None:
            how, label, by = self.answered_by
            detail["approved"] = {"by": by, "through": how, "request": label}
        return detail


class Places:
    """The agent's workspace, home and repositories, as the executor reports them (cached)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.workspace = os.path.realpath(executor.root)
        self.home: str | None = None
        self._roots: tuple[str, ...] = ()
        self._roots_at = -GIT_ROOTS_SECONDS

    async def agent_home(self) -> str:
        if self.home is None:
            ask = getattr(self.executor, "identity", None)  # the executor process's; in-process, our own user
            if ask is None:
                self.home = os.path.expanduser("~")
                return self.home
            try:
                identity = await ask()
            except ExecutorError:
                return "/nonexistent"  # not remembered: asked again on the next call
            self.home = str(identity.get("home") or "/nonexistent")
        return self.home

    async def git_roots(self) -> tuple[str, ...]:
        if time.monotonic() - self._roots_at >= GIT_ROOTS_SECONDS:
            try:
                self._roots = tuple(await self.executor.git_roots())
            except ExecutorError as error:
                logger.warning("could not list the workspace's git repositories for the policy: %s", error)
                self._roots = ()  # every path is then outside a repository: the stricter reading
            self._roots_at = time.monotonic()
        return self._roots


_places: dict[int, Places] = {}


def places_for(executor: Executor) -> Places:
    """The one Places of this executor (kept for the process's life, as the executor is)."""
    found = _places.get(id(executor))
    if found is None or found.executor is not executor:
        found = _places[id(executor)] = Places(executor)
    return found


_client_ids: dict[int, str] = {}


def _client_id(application_id: int) -> str:
    found = get_application_model().objects.filter(pk=application_id).values_list("client_id", flat=True).first()
    return found or ""


async def client_id_of(principal: Principal) -> str | None:
    if principal.application_id is None:
        return None
    found = _client_ids.get(principal.application_id)
    if found is None:
        found = _client_ids[principal.application_id] = await sync_to_async(_client_id)(principal.application_id)
    return found


async def decide_call(
    tool: str, arguments: Mapping[str, Any], principal: Principal, places: Places, loaded: LoadedPolicy | None = None
) -> Decision:
    """The policy's decision on this call, and the approver the deciding rule names."""
    loaded = loaded or await POLICY.current()
    if loaded.broken:
        return Decision(Verdict("deny", "policy", loaded.broken), "staff", loaded.version)
    if loaded.allows_everything:
        return Decision(ALLOW_ALL, "staff", loaded.version, recorded=False)
    caller = Caller(principal.username, principal.credential_name, await client_id_of(principal), principal.scopes)
    roots = await places.git_roots() if loaded.needs_git_roots and tool in COMMAND_TOOLS else ()
    facts = CallFacts(tool, arguments, caller, places.workspace, await places.agent_home(), roots)
    verdict = evaluate(loaded.policy, facts)
    rule = next((rule for rule in loaded.policy.rules if rule.id == verdict.rule_id), None)
    return Decision(verdict, rule.approver if rule is not None else "staff", loaded.version)


def command_shape(tool: str, arguments: Mapping[str, Any], rule_id: str) -> str:
    """What a timed grant covers: for a command, each command's name and options (not its operands), so that
    approving `git push --force origin main` for ten minutes also lets `git push --force origin fix` run; for any
    other tool, the calls the same rule asks about."""
    command = arguments.get("command")
    if tool in COMMAND_TOOLS and isinstance(command, str):
        parsed: ParsedCommand = parse_command(command)
        if parsed.opaque:
            return f"exact:{command[:280]}"
        words = [" ".join([c.name, *(w for w in c.argv[1:] if w.startswith("-"))]) for c in parsed.commands]
        return " ; ".join(words)[:300]
    return f"rule:{rule_id}"
