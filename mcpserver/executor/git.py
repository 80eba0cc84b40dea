"""The git tools: clone, status, commit, push, pull, branch, checkout, diff and log inside the workspace.

GitPython finds and checks the repository; it does that in-process, reading files, without running git. Every
git command then runs through `run_process`, with our clean environment and nothing else: GitPython's
`Git.execute` always starts the child's environment from `os.environ` (it can add to it, never drop from it),
which would hand the server's settings and secrets to git and to any hook the repository carries.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import git
from git.exc import InvalidGitRepositoryError, NoSuchPathError

from mcpserver.executor import gitargs
from mcpserver.executor.interface import ExecResult, ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import run_process
from mcpserver.executor.savedoutput import SavedOutput

CLONE_TIMEOUT = 120.0
NETWORK_TIMEOUT = 60.0  # push and pull
LOCAL_TIMEOUT = 60.0  # everything else (a commit may run hooks)
OUTPUT_BUDGET = 1_000_000
MAX_LOG_ENTRIES = 100
ALLOWED_PROTOCOLS = "file:git:http:https:ssh"  # GIT_ALLOW_PROTOCOL: ext::, fd:: and helpers are blocked by git
DEFAULT_IDENTITY = {"user.name": "Sandstorm Agent", "user.email": "agent@sandstorm.invalid"}
# Variables that would point git at another repository than the one we checked, even if an admin passes them.
REPOSITORY_VARIABLES = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
)


@dataclass(frozen=True)
class Repository:
    """A checked repository: `cwd` is the directory named (git runs there), inside the workspace."""

    cwd: Path
    has_commits: bool


def combined_output(result: ExecResult) -> str:
    """stdout then stderr, trimmed; a note on where the whole output is when it was cut."""
    parts = [text.strip("\n") for text in (result.stdout, result.stderr) if text.strip()]
    if result.truncated and result.output_path:
        parts.append(f"(output cut; the whole output is in {result.output_path})")
    return "\n".join(parts)


def find_repository(workspace: Workspace, real: Path) -> Repository:
    """The repository containing `real`, refused unless its working tree and git directory are in the workspace.

    GitPython walks up without honouring GIT_CEILING_DIRECTORIES, so a repository it finds above the workspace
    (the workspace inside another checkout) is refused here, with the same message as no repository at all.
    """
    failure = ToolFailure(f"Error: {real} is not a git repository")
    try:
        repo = git.Repo(real, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError, OSError):
        raise failure from None
    try:
        places = [repo.git_dir, repo.working_tree_dir or repo.git_dir]
        if not all(workspace.contains(Path(os.path.realpath(place))) for place in places):
            raise failure
        return Repository(cwd=real, has_commits=_has_commits(repo))
    finally:
        repo.close()


def _has_commits(repo: git.Repo) -> bool:
    # Resolving the ref only reads files; `repo.head.is_valid()` would start `git cat-file` with os.environ.
    try:
        git.SymbolicReference.dereference_recursive(repo, "HEAD")
    except (ValueError, OSError):
        return False
    return True


class GitOps:
    workspace: Workspace
    root: str
    env: dict[str, str]
    saved_output: SavedOutput

    # --- plumbing ------------------------------------------------------------------------------------------------
    def _git_env(self) -> dict[str, str]:
        env = {name: value for name, value in self.env.items() if name not in REPOSITORY_VARIABLES}
        env["GIT_TERMINAL_PROMPT"] = "0"
        env["GIT_CEILING_DIRECTORIES"] = str(self.workspace.root.parent)  # never discover a repository above us
        env["GIT_ALLOW_PROTOCOL"] = ALLOWED_PROTOCOLS
        return env

    async def _run(self, cwd: Path, args: Sequence[str], timeout: float = LOCAL_TIMEOUT) -> ExecResult:
        """`git <args>` in `cwd`; a timeout becomes a ToolFailure, any exit code is returned."""
        command = next((arg for arg in args if not arg.startswith("-") and "=" not in arg), "command")
        try:
            result = await run_process(
                ["git", *args],
                cwd=str(cwd),
                env=self._git_env(),
                timeout=timeout,
                output_budget=OUTPUT_BUDGET,
                listener=None,
                saved=self.saved_output,
                label="git",
            )
        except OSError as exc:
            raise ToolFailure(f"Error: could not run git: {exc}") from None
        if result.timed_out:
            raise ToolFailure(f"Error: git {command} timed out after {timeout:g}s")
        return result

    async def _git(self, cwd: Path, args: Sequence[str], timeout: float = LOCAL_TIMEOUT) -> str:
        """`git <args>` in `cwd`; its combined output, or a ToolFailure carrying it when git fails."""
        result = await self._run(cwd, args, timeout)
        output = combined_output(result)
        if result.exit_code != 0:
            raise ToolFailure("Error: " + (output or f"git exited with status {result.exit_code}"))
        return output

    async def _repository(self, path: str | None) -> Repository:
        real = self.workspace.resolve(path)
        if not real.is_dir():
            raise ToolFailure(f"Error: {real} is not a directory")
        return await asyncio.to_thread(find_repository, self.workspace, real)

    async def _check_branch(self, name: str, cwd: Path, check_syntax: bool = True) -> None:
        if check_syntax:
            gitargs.check_branch_syntax(name)
        result = await self._run(cwd, ["check-ref-format", "--branch", name])
        if result.exit_code != 0:
            raise ToolFailure(f"Error: invalid branch name '{name}': git check-ref-format refuses it")

    async def _check_remote(self, remote: str, cwd: Path) -> None:
        """A remote configured in the repository, or else a URL that passes the clone checks."""
        gitargs.check_remote_name(remote)
        configured = (await self._git(cwd, ["remote"])).split()
        if remote in configured:
            return
        if not gitargs.looks_like_url(remote):
            known = ", ".join(configured) or "none"
            raise ToolFailure(f"Error: '{remote}' is neither a remote of this repository (remotes: {known}) nor a URL")
        gitargs.check_repository_url(remote)

    async def _identity_options(self, cwd: Path) -> list[str]:
        """`-c user.name=... -c user.email=...` for whichever of the two the repository's config lacks."""
        result = await self._run(cwd, ["config", "--get-regexp", r"^user\.(name|email)$"])
        configured = {line.split(" ", 1)[0] for line in result.stdout.splitlines()}
        options: list[str] = []
        for key, value in DEFAULT_IDENTITY.items():
            if key not in configured:
                options += ["-c", f"{key}={value}"]
        return options

    # --- tools -----------------------------------------------------------------------------------------------------
    async def git_clone(self, repo_url: str, path: str | None, branch: str | None) -> str:
        gitargs.check_repository_url(repo_url)
        dest = self.workspace.resolve(path or gitargs.directory_name_from_url(repo_url))
        root = self.workspace.root
        args = ["clone", "--no-progress"]
        if branch is not None:
            await self._check_branch(branch, root)
            args.append(f"--branch={branch}")
        args += ["--end-of-options", repo_url, str(dest)]
        output = await self._git(root, args, timeout=CLONE_TIMEOUT)
        return output or f"Cloned {repo_url} into {dest}"

    async def git_status(self, path: str | None) -> str:
        repo = await self._repository(path)
        return await self._git(repo.cwd, ["status"])

    async def git_commit(self, message: str, path: str | None) -> str:
        if "\x00" in message:
            raise ToolFailure("Error: the commit message contains a NUL byte")
        repo = await self._repository(path)
        await self._git(repo.cwd, ["add", "-A"])
        identity = await self._identity_options(repo.cwd)
        return await self._git(repo.cwd, [*identity, "commit", "-m", message])

    async def git_push(self, remote: str | None, branch: str | None, path: str | None) -> str:
        repo = await self._repository(path)
        args = await self._remote_args(repo.cwd, remote, branch)
        return await self._git(repo.cwd, ["push", "--end-of-options", *args], timeout=NETWORK_TIMEOUT) or "Pushed"

    async def git_pull(self, remote: str | None, branch: str | None, path: str | None) -> str:
        repo = await self._repository(path)
        args = await self._remote_args(repo.cwd, remote, branch)
        identity = await self._identity_options(repo.cwd)  # a pull may create a merge commit
        command = [*identity, "pull", "--end-of-options", *args]
        return await self._git(repo.cwd, command, timeout=NETWORK_TIMEOUT) or "Pulled"

    async def _remote_args(self, cwd: Path, remote: str | None, branch: str | None) -> list[str]:
        remote = remote or "origin"
        await self._check_remote(remote, cwd)
        if not branch:
            return [remote]
        gitargs.check_refspec_branch(branch)
        await self._check_branch(branch, cwd, check_syntax=False)
        return [remote, branch]

    async def git_branch(self, name: str | None, path: str | None) -> str:
        repo = await self._repository(path)
        if name is None:
            return await self._git(repo.cwd, ["branch", "-a"]) or "(no branches yet)"
        await self._check_branch(name, repo.cwd)
        return await self._git(repo.cwd, ["branch", "--end-of-options", name]) or f"Created branch {name}"

    async def git_checkout(self, branch: str, path: str | None) -> str:
        repo = await self._repository(path)
        await self._check_branch(branch, repo.cwd)
        # No --end-of-options here: git 2.39's checkout then counts the trailing "--" as a second reference.
        # The name cannot start with '-' (checked above), and "--" ends the options and starts the pathspecs.
        return await self._git(repo.cwd, ["checkout", branch, "--"])

    async def git_diff(self, path: str | None) -> str:
        repo = await self._repository(path)
        return await self._git(repo.cwd, ["diff"]) or "(no changes)"

    async def git_log(self, n: int, path: str | None) -> str:
        if n < 1:
            raise ToolFailure(f"Error: n must be at least 1 (got {n})")
        repo = await self._repository(path)
        if not repo.has_commits:
            return "(no commits yet)"
        count = min(n, MAX_LOG_ENTRIES)
        return await self._git(repo.cwd, ["log", f"--max-count={count}", "--format=%h %s"])
