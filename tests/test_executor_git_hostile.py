"""No git tool runs a program a repository names: every vector of tests/hostile_git.py against the executor.

Also the repository layouts the tools open, and what they say when they turned off something a repository uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpserver.executor import gitconfig
from mcpserver.executor.interface import ToolFailure
from tests import hostile_git
from tests.test_executor_git import GitExecutor, Setup, executor, setup, workspace  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with hostile_git.unauthorized_http() as url:
        yield url


async def call(executor: GitExecutor, tool: str, path: str, arguments: dict[str, object]) -> str:
    method = getattr(executor, tool)
    try:
        if tool == "git_log":
            return await method(arguments["n"], path)
        if tool == "git_branch":
            return await method(arguments.get("name"), path)
        if tool == "git_commit":
            return await method(arguments["message"], path)
        if tool == "git_checkout":
            return await method(arguments["branch"], path)
        if tool in ("git_push", "git_pull"):
            return await method(arguments["remote"], arguments["branch"], path)
        return await method(path)
    except ToolFailure as failure:
        return str(failure)


@pytest.mark.parametrize("vector", list(hostile_git.VECTORS))
async def test_no_git_tool_runs_a_program_the_repository_names(
    setup: Setup, workspace: Path, executor: GitExecutor, http_url: str, vector: str
) -> None:
    hostile = hostile_git.build(workspace, vector, setup.env, http_url)
    for tool, arguments in hostile_git.calls(hostile, writes=True):
        text = await call(executor, tool, hostile.path, arguments)
        assert not hostile.marker.exists(), f"{vector}: {tool}({arguments}) ran the payload:\n{text}"


# --- layouts ---------------------------------------------------------------------------------------------------------


async def test_a_nested_bare_repository_named_directly_is_read_as_bare(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "nested-bare-gpg", setup.env)
    assert (await executor.git_log(5, hostile.path)).endswith(" Initial commit")
    assert "main" in await executor.git_branch(None, hostile.path)
    with pytest.raises(ToolFailure, match="must be run in a work tree"):
        await executor.git_status(hostile.path)


async def test_a_bare_repository_whose_config_moves_the_working_tree_is_refused(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "nested-bare-worktree-fsmonitor", setup.env)
    with pytest.raises(ToolFailure, match=r"its config moves the working tree \(core.worktree = "):
        await executor.git_status(hostile.path)
    assert not hostile.marker.exists()


async def test_a_directory_inside_a_nested_bare_repository_belongs_to_the_enclosing_working_tree(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "nested-bare-worktree-fsmonitor", setup.env)
    status = await executor.git_status("repo/vendor/x.git/refs")
    assert "On branch main" in status and "a.txt" in status
    assert not hostile.marker.exists()


async def test_a_relative_core_worktree_is_resolved_against_the_git_directory(
    setup: Setup, workspace: Path, executor: GitExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From ws/a/.git, "../../../outside" is outside the workspace; from the executor's working directory
    # ws/x/y/z it would be ws/outside, inside: the old check resolved it there and let git use the outside tree.
    outside = setup.tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the agent\n")
    setup.git(workspace, "init", "-q", "a")
    setup.git(workspace / "a", "config", "core.worktree", "../../../outside")
    (workspace / "outside").mkdir()
    cwd = workspace / "x" / "y" / "z"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    with pytest.raises(ToolFailure) as refused:
        await executor.git_status("a")
    assert "secret.txt" not in str(refused.value)
    assert "core.worktree = ../../../outside" in str(refused.value)


async def test_a_submodule_whose_git_directory_names_its_own_working_tree_is_opened(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    # The layout `git submodule` makes: `sub/.git` is a file, the git directory's core.worktree points back.
    git_dir = workspace / "super" / ".git" / "modules" / "sub"
    setup.git(workspace, "init", "-q", "--bare", str(git_dir))
    sub = workspace / "super" / "sub"
    sub.mkdir()
    (sub / ".git").write_text("gitdir: ../.git/modules/sub\n")
    setup.git(git_dir, "config", "core.bare", "false")
    setup.git(git_dir, "config", "core.worktree", "../../../sub")
    (sub / "f.txt").write_text("f\n")
    assert "f.txt" in await executor.git_status("super/sub")


async def test_a_linked_worktree_is_opened(setup: Setup, workspace: Path, executor: GitExecutor) -> None:
    main = workspace / "main"
    setup.git(workspace, "init", "-q", "-b", "main", str(main))
    setup.git(main, "commit", "-q", "--allow-empty", "-m", "First")
    setup.git(main, "worktree", "add", "-q", "-b", "side", str(workspace / "side"))
    assert "On branch side" in await executor.git_status("side")


async def test_a_gitfile_pointing_at_a_git_directory_outside_the_workspace_is_refused(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    setup.git(setup.tmp, "init", "-q", "--bare", str(setup.tmp / "elsewhere.git"))
    (workspace / "linked").mkdir()
    (workspace / "linked" / ".git").write_text("gitdir: ../../elsewhere.git\n")
    with pytest.raises(ToolFailure, match="is not a git repository"):
        await executor.git_status("linked")


# --- what the tools say when they turned something off ---------------------------------------------------------------


async def test_a_filter_driver_of_the_repositorys_own_config_is_skipped_and_the_result_says_so(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "filter-clean-smudge", setup.env)
    status = await executor.git_status("repo")
    assert "modified:   a.txt" in status
    assert status.endswith(
        "Note: this repository's own filter drivers were not run (evil): the git tools never run programs a "
        "repository's config names; run git with terminal_exec to use them."
    )
    assert "Note: this repository's own filter drivers" in await executor.git_commit("Change a", "repo")
    assert not hostile.marker.exists()


async def test_the_admins_credential_helper_is_kept_and_the_repositorys_is_not(
    setup: Setup, workspace: Path, executor: GitExecutor, http_url: str
) -> None:
    hostile = hostile_git.build(workspace, "credential-helper", setup.env, http_url)
    asked = setup.tmp / "admin_helper_asked"
    helper = setup.tmp / "admin-helper.sh"
    helper.write_text(f"#!/bin/sh\ntouch {asked}\n")
    helper.chmod(0o755)
    (setup.home / ".gitconfig").write_text(f"[credential]\n\thelper = {helper}\n")
    await call(executor, "git_pull", "repo", {"remote": "origin", "branch": "main"})
    assert asked.exists() and not hostile.marker.exists()


def test_every_command_runs_without_pager_and_diffs_without_external_programs() -> None:
    assert gitconfig.command_argv(["status"]) == ["git", "--no-pager", "status"]
    assert gitconfig.command_argv(["-c", "user.name=x", "log", "-1"]) == [
        "git",
        "--no-pager",
        "-c",
        "user.name=x",
        "log",
        "--no-ext-diff",
        "--no-textconv",
        "-1",
    ]
    assert gitconfig.command_argv(["diff"]) == ["git", "--no-pager", "diff", "--no-ext-diff", "--no-textconv"]


async def test_config_variables_in_the_environment_do_not_reach_git(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "nested-bare-gpg", setup.env)
    executor.env = {
        **executor.env,
        "GIT_CONFIG_PARAMETERS": "'log.showsignature'='true'",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "log.showSignature",
        "GIT_CONFIG_VALUE_0": "true",
    }
    await executor.git_log(5, hostile.path)
    assert not hostile.marker.exists()


async def test_a_pull_that_needs_the_repositorys_merge_driver_fails_and_says_why(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "merge-driver", setup.env)
    await executor.git_commit("Change a", "repo")
    with pytest.raises(ToolFailure) as failed:
        await executor.git_pull("origin", "main", "repo")
    assert str(failed.value).startswith("Error: ")
    assert str(failed.value).endswith(
        "Note: this repository's own merge drivers were not run (evil): the git tools never run programs a "
        "repository's config names; run git with terminal_exec to use them."
    )
    assert not hostile.marker.exists()
