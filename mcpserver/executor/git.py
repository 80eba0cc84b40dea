"""The git tools: clone, status, commit, push, pull, branch, checkout, diff and log inside the workspace.

A repository in the workspace is hostile: its config and attributes may name programs for git to run. So:
`gitlayout` picks the repository in-process (usual layouts only) and git is told exactly which one it is
(`GIT_DIR`, `GIT_WORK_TREE`); `gitconfig` builds the command-scope config that turns off every program the
repository's config names, and the command line (`--no-pager`, `--no-ext-diff --no-textconv`). Every git
command goes through `_run`, with our clean environment and nothing else (never `os.environ`, which would hand
the server's settings and secrets to git).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from mcpserver.executor import gitargs, gitconfig
from mcpserver.executor.gitlayout import Layout, configured_work_tree, find_layout
from mcpserver.executor.interface import ExecResult, ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import run_process
from mcpserver.executor.savedoutput import SavedOutput

CLONE_TIMEOUT = 120.0
NETWORK_TIMEOUT = 60.0  # push and pull
LOCAL_TIMEOUT = 60.0  # everything else
OUTPUT_BUDGET = 1_000_000
INDEX_LISTING_BUDGET = 64_000_000  # `ls-files --stage` of a large repository, read for its gitlinks
GITLINK_MODE = "160000"
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
    "GIT_IMPLICIT_WORK_TREE",
)
# The hooks each tool would have run, for the note that says they were not (see gitconfig.FIXED_OVERRIDES).
REF_HOOKS = ("reference-transaction",)
COMMIT_HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", *REF_HOOKS)
PULL_HOOKS = ("pre-merge-commit", "post-merge", *REF_HOOKS)
PUSH_HOOKS = ("pre-push", *REF_HOOKS)
CHECKOUT_HOOKS = ("post-checkout", *REF_HOOKS)
# For status, diff and the like: a submodule whose checked-out commit moved shows, but git never looks at the files
# inside it, which would run `git status` there with the submodule's own config (filters) and none of our overrides.
# On the command line, as a submodule's `ignore` in .gitmodules beats git's config.
SUBMODULES_UNOPENED = ("--ignore-submodules=dirty",)


@dataclass(frozen=True)
class Repository:
    """A checked repository: `cwd` is the directory named (git runs there), inside the workspace."""

    cwd: Path
    layout: Layout
    env: dict[str, str]
    overrides: gitconfig.Overrides = field(default_factory=gitconfig.Overrides)
    config: tuple[gitconfig.ConfigEntry, ...] = ()

    def with_config(self, *pairs: tuple[str, str]) -> Repository:
        """The same repository, with `pairs` after our overrides (in the environment: a key may hold any text)."""
        every = (*gitconfig.FIXED_OVERRIDES, *self.overrides.pairs, *pairs)
        return replace(self, env={**self.env, **gitconfig.config_environment(every)})


def combined_output(result: ExecResult) -> str:
    """stdout then stderr, trimmed; a note on where the whole output is when it was cut."""
    parts = [text.strip("\n") for text in (result.stdout, result.stderr) if text.strip()]
    if result.truncated and result.output_path:
        parts.append(f"(output cut; the whole output is in {result.output_path})")
    return "\n".join(parts)


def with_notes(output: str, notes: Sequence[str]) -> str:
    return "\n".join([output, *notes]) if output else "\n".join(notes)


def layout_environment(layout: Layout) -> dict[str, str]:
    """The variables that tell git which repository it is, so it neither discovers nor relocates one."""
    env = {"GIT_DIR": str(layout.git_dir)}
    if layout.work_tree is None:
        env["GIT_IMPLICIT_WORK_TREE"] = "0"  # bare: not the current directory as a working tree
    else:
        env["GIT_WORK_TREE"] = str(layout.work_tree)
    return env


def check_work_tree(layout: Layout, real: Path, configured: str | None) -> None:
    """Refuse a core.worktree that moves the working tree away from the usual layout (or gives a bare one)."""
    if configured is None or layout.linked:
        return  # git takes no core.worktree from a linked worktree's config
    if layout.work_tree is not None and configured_work_tree(layout, configured) == layout.work_tree:
        return  # a submodule's git directory names its own working tree
    raise ToolFailure(
        f"Error: {real} is not a git repository in a usual layout: its config moves the working tree "
        f"(core.worktree = {configured}); the git tools use only <dir>/.git or a bare repository named directly"
    )


def skipped_hooks(repo: Repository, names: Sequence[str]) -> list[str]:
    """A note naming the hooks among `names` the repository has and git would have run, if any."""
    layout, hooks_path = repo.layout, repo.overrides.hooks_path
    if hooks_path is None:
        directory = layout.common_dir / "hooks"
    else:
        directory = Path(os.path.expanduser(hooks_path))
        if not directory.is_absolute():
            directory = (layout.work_tree or layout.git_dir) / directory
    present = [name for name in names if os.access(directory / name, os.X_OK) and (directory / name).is_file()]
    if not present:
        return []
    return [
        f"Note: this repository's hooks were not run ({', '.join(present)}): the git tools never run hooks; "
        "run git with terminal_exec to use them."
    ]


class GitOps:
    workspace: Workspace
    root: str
    env: dict[str, str]
    saved_output: SavedOutput

    # --- plumbing ------------------------------------------------------------------------------------------------
    def _git_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Our clean environment with the fixed overrides, plus `extra` (a repository's own variables)."""
        env = {
            name: value
            for name, value in self.env.items()
            if name not in REPOSITORY_VARIABLES and not gitconfig.is_config_variable(name)
        }
        env["GIT_TERMINAL_PROMPT"] = "0"
        env["GIT_CEILING_DIRECTORIES"] = str(self.workspace.root.parent)  # never discover a repository above us
        env["GIT_ALLOW_PROTOCOL"] = ALLOWED_PROTOCOLS
        env["GIT_EDITOR"] = env["GIT_SEQUENCE_EDITOR"] = ":"
        env["GIT_PAGER"] = "cat"
        # `status` refreshes the index when it can: a write. The read-only tools write nothing (their audit records
        # are committed after they ran).
        env["GIT_OPTIONAL_LOCKS"] = "0"
        env.update(gitconfig.config_environment(gitconfig.FIXED_OVERRIDES))
        env.update(extra or {})
        return env

    async def _run(
        self,
        cwd: Path,
        args: Sequence[str],
        timeout: float = LOCAL_TIMEOUT,
        env: dict[str, str] | None = None,
        budget: int = OUTPUT_BUDGET,
    ) -> ExecResult:
        """`git <args>` in `cwd` (with `env`, by default `_git_env()`); a timeout becomes a ToolFailure."""
        command = next((arg for arg in args if not arg.startswith("-") and "=" not in arg), "command")
        try:
            result = await run_process(
                gitconfig.command_argv(args),
                cwd=str(cwd),
                env=self._git_env() if env is None else env,
                timeout=timeout,
                output_budget=budget,
                listener=None,
                saved=self.saved_output,
                label="git",
            )
        except OSError as exc:
            raise ToolFailure(f"Error: could not run git: {exc}") from None
        if result.timed_out:
            raise ToolFailure(f"Error: git {command} timed out after {timeout:g}s")
        return result

    async def _git(
        self, cwd: Path, args: Sequence[str], timeout: float = LOCAL_TIMEOUT, env: dict[str, str] | None = None
    ) -> str:
        """`git <args>` in `cwd`; its combined output, or a ToolFailure carrying it when git fails."""
        result = await self._run(cwd, args, timeout, env)
        output = combined_output(result)
        if result.exit_code != 0:
            raise ToolFailure("Error: " + (output or f"git exited with status {result.exit_code}"))
        return output

    async def _repository(self, path: str | None) -> Repository:
        """The repository `path` is in, with the environment that turns off every program its config names."""
        real = self.workspace.resolve(path)
        if not real.is_dir():
            raise ToolFailure(f"Error: {real} is not a directory")
        layout = await asyncio.to_thread(find_layout, self.workspace, real)
        located = self._git_env(layout_environment(layout))
        listing = await self._git(real, ["config", "-z", "--show-scope", "--list"], env=located)
        config = tuple(gitconfig.parse_listing(listing))
        overrides = gitconfig.repository_overrides(config, self.env)
        check_work_tree(layout, real, overrides.work_tree)
        pairs = (*gitconfig.FIXED_OVERRIDES, *overrides.pairs)
        env = {**located, **gitconfig.config_environment(pairs), **overrides.env}
        return Repository(cwd=real, layout=layout, env=env, overrides=overrides, config=config)

    async def _in(self, repo: Repository, args: Sequence[str], timeout: float = LOCAL_TIMEOUT) -> str:
        return await self._git(repo.cwd, args, timeout, repo.env)

    async def _noted(
        self,
        repo: Repository,
        args: Sequence[str],
        notes: Sequence[str],
        timeout: float = LOCAL_TIMEOUT,
        default: str = "",
    ) -> str:
        """`_in`, with `notes` (what was turned off) after the output, or after the error text when git failed."""
        try:
            output = await self._in(repo, args, timeout) or default
        except ToolFailure as failure:
            raise ToolFailure(with_notes(str(failure), notes)) from None
        return with_notes(output, notes)

    async def _check_branch(self, name: str, cwd: Path, env: dict[str, str] | None, check_syntax: bool = True) -> None:
        if check_syntax:
            gitargs.check_branch_syntax(name)
        result = await self._run(cwd, ["check-ref-format", "--branch", name], env=env)
        if result.exit_code != 0:
            raise ToolFailure(f"Error: invalid branch name '{name}': git check-ref-format refuses it")

    async def _check_remote(self, remote: str, repo: Repository) -> None:
        """A remote configured in the repository, or else a URL that passes the clone checks."""
        gitargs.check_remote_name(remote)
        configured = (await self._in(repo, ["remote"])).split()
        if remote in configured:
            return
        if not gitargs.looks_like_url(remote):
            known = ", ".join(configured) or "none"
            raise ToolFailure(f"Error: '{remote}' is neither a remote of this repository (remotes: {known}) nor a URL")
        gitargs.check_repository_url(remote)

    async def _identity_options(self, repo: Repository) -> list[str]:
        """`-c user.name=... -c user.email=...` for whichever of the two the repository's config lacks."""
        result = await self._run(repo.cwd, ["config", "--get-regexp", r"^user\.(name|email)$"], env=repo.env)
        configured = {line.split(" ", 1)[0] for line in result.stdout.splitlines()}
        options: list[str] = []
        for key, value in DEFAULT_IDENTITY.items():
            if key not in configured:
                options += ["-c", f"{key}={value}"]
        return options

    async def _has_commits(self, repo: Repository) -> bool:
        result = await self._run(repo.cwd, ["rev-parse", "--verify", "--quiet", "HEAD"], env=repo.env)
        return result.exit_code == 0

    # --- tools -----------------------------------------------------------------------------------------------------
    async def git_clone(self, repo_url: str, path: str | None, branch: str | None) -> str:
        gitargs.check_repository_url(repo_url)
        dest = self.workspace.resolve(path or gitargs.directory_name_from_url(repo_url))
        root = self.workspace.root
        args = ["clone", "--no-progress"]
        if branch is not None:
            await self._check_branch(branch, root, None)
            args.append(f"--branch={branch}")
        args += ["--end-of-options", repo_url, str(dest)]
        output = await self._git(root, args, timeout=CLONE_TIMEOUT)
        return output or f"Cloned {repo_url} into {dest}"

    async def git_status(self, path: str | None) -> str:
        repo = await self._repository(path)
        command = ["status", *SUBMODULES_UNOPENED]
        return await self._noted(repo, command, repo.overrides.notes(filters=True, merges=False))

    async def git_commit(self, message: str, path: str | None) -> str:
        if "\x00" in message:
            raise ToolFailure("Error: the commit message contains a NUL byte")
        repo = await self._repository(path)
        notes = repo.overrides.notes(filters=True, merges=False) + skipped_hooks(repo, COMMIT_HOOKS)
        await self._noted(repo, ["add", "-A", *await self._gitlink_exclusions(repo)], notes)
        identity = await self._identity_options(repo)
        return await self._noted(repo, [*identity, "commit", "-m", message], notes)

    async def _gitlink_exclusions(self, repo: Repository) -> list[str]:
        """Pathspecs for `add -A` that leave out the gitlinks whose recorded commit is still checked out.

        For those `add` runs `git status` inside the submodule, which reads the submodule's own config (its
        filters) and none of our overrides; a gitlink whose commit moved is staged without looking inside.
        """
        listing = await self._run(repo.cwd, ["ls-files", "--stage", "-z"], env=repo.env, budget=INDEX_LISTING_BUDGET)
        if listing.exit_code != 0 or listing.truncated:
            raise ToolFailure("Error: " + (combined_output(listing) or "could not list the index for its submodules"))
        gitlinks = [entry.split("\t", 1)[1] for entry in listing.stdout.split("\0") if entry.startswith(GITLINK_MODE)]
        if not gitlinks:
            return []
        changed = await self._in(repo, ["diff-files", "--name-only", "-z", *SUBMODULES_UNOPENED])
        moved = set(changed.split("\0"))
        kept = [f":(top,exclude,literal){link}" for link in gitlinks if link not in moved]
        return ["--", ":/", *kept] if kept else []

    async def git_push(self, remote: str | None, branch: str | None, path: str | None) -> str:
        repo = await self._repository(path)
        remote = remote or "origin"
        await self._check_remote(remote, repo)
        branch = branch or await self._checked_out_branch(repo)
        gitargs.check_refspec_branch(branch)
        await self._check_branch(branch, repo.cwd, repo.env, check_syntax=False)
        pack = await self._pack_program(repo, remote, "receive-pack")
        # One branch to the branch of that name, never forced: the repository's push refspecs (`+` forces, `:x`
        # deletes), `remote.<name>.mirror` and `push.default` cannot widen it.
        refspec = f"refs/heads/{branch}:refs/heads/{branch}"
        command = ["push", "--no-recurse-submodules", *pack, "--end-of-options", remote, refspec]
        pushing = repo.with_config((f"remote.{remote}.mirror", "false"))
        notes = gitconfig.ignored_push_settings(repo.config, remote) + skipped_hooks(repo, PUSH_HOOKS)
        return await self._noted(pushing, command, notes, NETWORK_TIMEOUT, "Pushed")

    async def _checked_out_branch(self, repo: Repository) -> str:
        branch = await self._branch_name(repo)
        if branch is None:
            raise ToolFailure("Error: no branch is checked out (HEAD is detached); name the branch to push")
        return branch

    async def git_pull(self, remote: str | None, branch: str | None, path: str | None) -> str:
        repo = await self._repository(path)
        args = await self._remote_args(repo, remote, branch)
        identity = await self._identity_options(repo)  # a pull may create a merge commit
        pack = await self._pack_program(repo, args[0], "upload-pack")
        command = [*identity, "pull", "--no-recurse-submodules", *pack, "--end-of-options", *args]
        notes = repo.overrides.notes(filters=True, merges=True) + skipped_hooks(repo, PULL_HOOKS)
        # A merge first saves local changes (`git stash create`), which looks inside submodules that .gitmodules
        # does not tell git to ignore; so every submodule it names is ignored.
        ignored = [(f"submodule.{name}.ignore", "all") for name in await self._submodule_names(repo)]
        return await self._noted(repo.with_config(*ignored), command, notes, NETWORK_TIMEOUT, "Pulled")

    async def _submodule_names(self, repo: Repository) -> list[str]:
        """The submodule names .gitmodules gives, from each place git may read it (work tree, index, HEAD)."""
        sources = [["--blob", ":.gitmodules"], ["--blob", "HEAD:.gitmodules"]]
        if repo.layout.work_tree is not None:
            sources.append(["--file", str(repo.layout.work_tree / ".gitmodules")])
        names: dict[str, None] = {}
        for source in sources:
            query = ["config", *source, "--name-only", "-z", "--get-regexp", r"^submodule\..*\.path$"]
            result = await self._run(repo.cwd, query, env=repo.env)
            if result.exit_code == 0:  # 1: none there
                keys = [key for key in result.stdout.split("\0") if key]
                names.update((key.removeprefix("submodule.").removesuffix(".path"), None) for key in keys)
        return list(names)

    async def _pack_program(self, repo: Repository, remote: str, command: str) -> list[str]:
        """`--receive-pack=`/`--upload-pack=` with our overrides when `remote` is reached on this machine.

        There git runs that program in the other repository, with its config and hooks, and without our
        command-scope config; so it gets ours on its command line, which also replaces the program a
        repository's `remote.<name>.receivepack`/`uploadpack` would name. Over ssh it runs on the other host.
        """
        if gitargs.looks_like_url(remote):
            # As git will rewrite it: url.<base>.insteadOf (what ls-remote prints), pushInsteadOf for a push.
            expanded = await self._in(repo, ["ls-remote", "--get-url", "--end-of-options", remote])
            urls = [remote, *expanded.splitlines()]
            rewritten = gitconfig.push_rewrite(remote, repo.config) if command == "receive-pack" else None
            urls += [rewritten] if rewritten else []
        else:
            push = ["--push"] if command == "receive-pack" else []
            urls = (await self._in(repo, ["remote", "get-url", *push, "--all", remote])).splitlines()
        if not any(gitargs.is_local_url(url) for url in urls):
            return []
        return [f"--{command}={gitconfig.local_pack_program(command)}"]

    async def _remote_args(self, repo: Repository, remote: str | None, branch: str | None) -> list[str]:
        remote = remote or "origin"
        await self._check_remote(remote, repo)
        if not branch:
            return [remote]
        gitargs.check_refspec_branch(branch)
        await self._check_branch(branch, repo.cwd, repo.env, check_syntax=False)
        return [remote, branch]

    async def git_branch(self, name: str | None, path: str | None) -> str:
        repo = await self._repository(path)
        if name is None:
            return await self._in(repo, ["branch", "-a"]) or "(no branches yet)"
        await self._check_branch(name, repo.cwd, repo.env)
        command = ["branch", "--end-of-options", name]
        return await self._noted(repo, command, skipped_hooks(repo, REF_HOOKS), default=f"Created branch {name}")

    async def git_checkout(self, branch: str, path: str | None) -> str:
        repo = await self._repository(path)
        await self._check_branch(branch, repo.cwd, repo.env)
        # No --end-of-options here: git 2.39's checkout then counts the trailing "--" as a second reference.
        # The name cannot start with '-' (checked above), and "--" ends the options and starts the pathspecs.
        # Quiet: git's own report of local changes looks inside populated submodules (with their config), and a
        # submodule's `ignore = none` in .gitmodules beats any setting of ours; the report is made below instead.
        notes = repo.overrides.notes(filters=True, merges=False) + skipped_hooks(repo, CHECKOUT_HOOKS)
        before = await self._branch_name(repo)
        output = await self._noted(repo, ["checkout", "--quiet", branch, "--"], notes)
        report = [await self._switch_report(repo, before), await self._local_changes(repo)]
        return "\n".join(part for part in (*report, output) if part)

    async def _branch_name(self, repo: Repository) -> str | None:
        result = await self._run(repo.cwd, ["symbolic-ref", "--quiet", "--short", "HEAD"], env=repo.env)
        return result.stdout.strip() if result.exit_code == 0 else None

    async def _switch_report(self, repo: Repository, before: str | None) -> str:
        """What `git checkout` says on success: the branch now checked out, or where a detached HEAD is."""
        after = await self._branch_name(repo)
        if after is None:
            return "HEAD is now at " + await self._in(repo, ["log", "-1", "--format=%h %s"])
        return f"Already on '{after}'" if after == before else f"Switched to branch '{after}'"

    async def _local_changes(self, repo: Repository) -> str:
        """The local changes carried over, as `git checkout` lists them (name and status against HEAD)."""
        return await self._in(repo, ["diff-index", "--name-status", *SUBMODULES_UNOPENED, "HEAD", "--"])

    async def git_diff(self, path: str | None) -> str:
        repo = await self._repository(path)
        notes = repo.overrides.notes(filters=True, merges=False)
        command = ["diff", *SUBMODULES_UNOPENED, "--submodule=short"]
        return await self._noted(repo, command, notes, default="(no changes)")

    async def git_log(self, n: int, path: str | None) -> str:
        if n < 1:
            raise ToolFailure(f"Error: n must be at least 1 (got {n})")
        repo = await self._repository(path)
        if not await self._has_commits(repo):
            return "(no commits yet)"
        count = min(n, MAX_LOG_ENTRIES)
        return await self._in(repo, ["log", f"--max-count={count}", "--format=%h %s"])
