"""git_clone, git_status, git_commit, git_push, git_pull, git_branch, git_checkout, git_diff, git_log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from mcpserver.call import ToolCall
from mcpserver.registry import tool
from mcpserver.results import ToolOutput, ToolResult

RepoArg = Annotated[str | None, Field(description="Repository directory; default the workspace root.")]
DEFAULT_LOG_COUNT = 10
NO_COMMITS = "(no commits yet)"  # the executor's text for a repository without commits
COMMIT_LINE = re.compile(r"([0-9a-f]{4,64}) (.*)", re.DOTALL)  # `--format=%h %s`: a subject holds no newline


class Commit(ToolOutput):
    hash: str = Field(description="The abbreviated commit hash.")
    subject: str = Field(description="The first line of its message.")


class LogResult(ToolOutput):
    commits: list[Commit] = Field(description="Newest first.")
    notes: list[str] = Field(description="Other lines git printed (warnings), in order; usually none.")


def log_result(text: str) -> ToolResult:
    """git_log's text and its commits, read from the lines the executor's `--format=%h %s` made."""
    commits: list[dict[str, str]] = []
    notes: list[str] = []
    for line in text.split("\n") if text != NO_COMMITS else []:
        found = COMMIT_LINE.fullmatch(line)
        if found:
            commits.append({"hash": found[1], "subject": found[2]})
        else:
            notes.append(line)
    return ToolResult(text, structured={"commits": commits, "notes": notes})


@tool(title="Clone a repository", open_world=True)
async def git_clone(
    call: ToolCall,
    repo_url: str,
    path: Annotated[
        str | None, Field(description="Where to clone; default a folder named after the repository.")
    ] = None,
    branch: str | None = None,
) -> ToolResult:
    """Clone a git repository into the workspace (120 s limit)."""
    return ToolResult(await call.executor.git_clone(repo_url, path, branch))


@tool(title="Repository status", read_only=True, idempotent=True)
async def git_status(call: ToolCall, path: RepoArg = None) -> ToolResult:
    """Show `git status` of a repository in the workspace."""
    return ToolResult(await call.executor.git_status(path))


@tool(title="Commit all changes")
async def git_commit(call: ToolCall, message: str, path: RepoArg = None) -> ToolResult:
    """Stage every change (`git add -A`) and commit it with the message."""
    return ToolResult(await call.executor.git_commit(message, path))


@tool(title="Push", open_world=True)
async def git_push(
    call: ToolCall,
    remote: Annotated[str | None, Field(description="Default origin.")] = None,
    branch: str | None = None,
    path: RepoArg = None,
) -> ToolResult:
    """Push to a remote (60 s limit)."""
    return ToolResult(await call.executor.git_push(remote, branch, path))


@tool(title="Pull", open_world=True)
async def git_pull(
    call: ToolCall,
    remote: Annotated[str | None, Field(description="Default origin.")] = None,
    branch: str | None = None,
    path: RepoArg = None,
) -> ToolResult:
    """Pull from a remote (60 s limit)."""
    return ToolResult(await call.executor.git_pull(remote, branch, path))


def _branch_creates(arguments: Mapping[str, Any]) -> str | None:
    return "git_branch with name" if arguments.get("name") else None


@tool(title="Create or list branches", read_only_when=_branch_creates)
async def git_branch(
    call: ToolCall,
    name: Annotated[str | None, Field(description="Branch to create; without it, list all branches.")] = None,
    path: RepoArg = None,
) -> ToolResult:
    """Create a branch, or list all branches (`git branch -a`) when no name is given."""
    return ToolResult(await call.executor.git_branch(name, path))


@tool(title="Check out a branch")
async def git_checkout(call: ToolCall, branch: str, path: RepoArg = None) -> ToolResult:
    """Switch to a branch or commit."""
    return ToolResult(await call.executor.git_checkout(branch, path))


@tool(title="Show unstaged changes", read_only=True, idempotent=True)
async def git_diff(call: ToolCall, path: RepoArg = None) -> ToolResult:
    """Show the unstaged diff, or `(no changes)`."""
    return ToolResult(await call.executor.git_diff(path))


@tool(title="Recent commits", read_only=True, idempotent=True, output=LogResult)
async def git_log(
    call: ToolCall,
    n: Annotated[int | None, Field(description="How many commits; default 10, at most 100.")] = None,
    path: RepoArg = None,
) -> ToolResult:
    """One line per commit: short hash and subject."""
    return log_result(await call.executor.git_log(DEFAULT_LOG_COUNT if n is None else n, path))
