"""The command policy at the dispatch point: the facts of one call (who, what, where) and the policy's verdict.

The policy itself is pure (mcpserver.policy); this module supplies what it needs from outside: the cached policy
(mcpserver.policy_source), the agent's workspace and home (asked of the executor once), the git repositories in
the workspace (asked of the executor, only for policies with an `outside-repos` pattern, at most every
GIT_ROOTS_SECONDS), the OAuth client id of a connected app, and for terminal_input the command of the job typed
into (the caller's own, from the registry of background commands).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from asgiref.sync import sync_to_async
from oauth2_provider.models import get_application_model

from mcpserver.approvals.following import is_label
from mcpserver.approvals.requests import request_of
from mcpserver.background import find_job
from mcpserver.executor.interface import Executor, ExecutorError
from mcpserver.models import BackgroundProcess
from mcpserver.policy.commands import SimpleCommand
from mcpserver.policy.evaluate import OPAQUE_ID, TYPING_TOOL, Caller, CallFacts, Job, Verdict, evaluate
from mcpserver.policy.rules import COMMAND_TOOLS
from mcpserver.policy.shell import parse_command
from mcpserver.policy.wrappers import PRIVILEGED
from mcpserver.policy_source import POLICY, LoadedPolicy
from oauth.credentials import Principal

logger = logging.getLogger(__name__)
GIT_ROOTS_SECONDS = 5.0
ALLOW_ALL = Verdict("allow", "default", "no policy rules")
SHAPE_CHARS = 300  # ApprovalGrant.shape and ApprovalRequest.shape


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
    typing = tool == TYPING_TOOL
    roots = await places.git_roots() if loaded.needs_git_roots and (tool in COMMAND_TOOLS or typing) else ()
    job = await job_typed_into(principal, arguments.get("id")) if typing else None
    facts = CallFacts(tool, arguments, caller, places.workspace, await places.agent_home(), roots, job)
    verdict = evaluate(loaded.policy, facts)
    return Decision(verdict, verdict.approver, loaded.version)


async def job_typed_into(principal: Principal, job_id: object) -> Job:
    """The caller's background command that terminal_input names (a PID, or a request's label), as recorded;
    Job(None) when it is not known yet (a request not started): its typed text is then read as shell text."""
    row: BackgroundProcess | None = None
    if isinstance(job_id, str) and is_label(job_id):
        row = await sync_to_async(_job_of_request)(principal.key, str(job_id))
    elif isinstance(job_id, int) or (isinstance(job_id, str) and job_id.strip().isdigit()):
        row = await find_job(principal, int(job_id))
    return Job(None) if row is None else Job(row.command, row.cwd)


def _job_of_request(key: str, label: str) -> BackgroundProcess | None:
    request = request_of(key, label)
    return request.background if request is not None else None


def command_shape(tool: str, arguments: Mapping[str, Any], rule_id: str) -> str:
    """What a timed grant covers: for a command (or text typed into a job), each command's name and options (not
    its operands), so that approving `git push --force origin main` for ten minutes also lets `git push --force
    origin fix` run; but a command run as another user (`sudo`, `doas`, `su`, `pkexec`, `chroot`) word for word,
    so that a grant for `sudo -n true` is not one for `sudo -n rm -rf /`; an opaque command, or a call the opaque
    part decided, exactly. For any other tool, the calls the same rule asks about."""
    command = arguments.get("text" if tool == TYPING_TOOL else "command")
    if (tool in COMMAND_TOOLS or tool == TYPING_TOOL) and isinstance(command, str):
        parsed = parse_command(command)
        if parsed.opaque or rule_id == OPAQUE_ID:
            return _fitted("exact:" + command)
        return _fitted(" ; ".join(_command_words(simple) for simple in parsed.commands))
    return f"rule:{rule_id}"


def _command_words(command: SimpleCommand) -> str:
    if command.name in PRIVILEGED:
        return shlex.join(command.argv)
    return " ".join([command.name, *(word for word in command.argv[1:] if word.startswith("-"))])


def _fitted(shape: str) -> str:
    """`shape` within SHAPE_CHARS; a longer one ends in its digest, so that two shapes alike in their first
    characters are never taken for one."""
    if len(shape) <= SHAPE_CHARS:
        return shape
    tail = " … sha256:" + hashlib.sha256(shape.encode("utf-8", "surrogatepass")).hexdigest()
    return shape[: SHAPE_CHARS - len(tail)] + tail
