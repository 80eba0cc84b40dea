"""The git layer's own defences (issue 31), which must hold without the kernel's confinement too: a populated
submodule's filter never runs, a repository borrowing objects from outside the workspace is refused, and
git_push never forces, deletes or mirrors because of the repository's config.

Each test runs with `SANDSTORM_KERNEL_CONFINEMENT=off` and without it; the hostile repositories are built here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcpserver.executor.interface import ToolFailure
from tests import hostile_git
from tests import test_executor_git as base
from tests.test_executor_git import GitExecutor, Setup

# The fixtures of the executor's git tests: a workspace, a repository in it with a bare remote outside, the executor.
setup, workspace, remote, repo, executor = base.setup, base.workspace, base.remote, base.repo, base.executor

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True, params=["default", "off"])
def confinement(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With the kernel's confinement as configured, and switched off for the executor."""
    if request.param == "off":
        monkeypatch.setenv("SANDSTORM_KERNEL_CONFINEMENT", "off")
    else:
        monkeypatch.delenv("SANDSTORM_KERNEL_CONFINEMENT", raising=False)
    return str(request.param)


# --- a populated submodule's filter ----------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", ["submodule-filter", "submodule-filter-not-ignored"])
@pytest.mark.parametrize("tool", ["git_status", "git_diff", "git_log"])
async def test_a_read_tool_never_runs_a_populated_submodules_own_filter(
    setup: Setup, workspace: Path, executor: GitExecutor, vector: str, tool: str
) -> None:
    hostile = hostile_git.build(workspace, vector, setup.env)
    if tool == "git_log":
        await executor.git_log(5, "repo")
    else:
        await getattr(executor, tool)("repo")
    assert not hostile.marker.exists()


async def test_git_status_shows_a_submodules_recorded_commit_but_not_its_files(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "submodule-filter", setup.env)
    assert "new file:   sub" in await executor.git_status("repo")
    sub = hostile.repo / "sub"
    (sub / "f.txt").write_text("changed inside\n")
    setup.git(sub, "commit", "-q", "-am", "Moved")
    hostile.marker.unlink()  # our own commit ran the filter
    os.utime(sub / "f.txt", (1_000_000_000, 1_000_000_000))
    status = await executor.git_status("repo")
    assert "modified:   sub (new commits)" in status and "modified content" not in status
    assert "Subproject commit" in await executor.git_diff("repo")
    assert not hostile.marker.exists()


async def test_git_commit_stages_a_moved_submodule_without_looking_inside_it(
    setup: Setup, workspace: Path, executor: GitExecutor
) -> None:
    hostile = hostile_git.build(workspace, "submodule-filter-not-ignored", setup.env)
    sub = hostile.repo / "sub"
    (sub / "g.txt").write_text("new\n")
    setup.git(sub, "add", "g.txt")
    setup.git(sub, "commit", "-q", "-m", "Moved")
    hostile.marker.unlink()
    os.utime(sub / "f.txt", (1_000_000_000, 1_000_000_000))
    await executor.git_commit("Move the submodule", "repo")
    assert setup.git(hostile.repo, "ls-tree", "HEAD", "sub").split()[2] == setup.git(sub, "rev-parse", "HEAD").strip()
    assert not hostile.marker.exists()


# --- alternates ------------------------------------------------------------------------------------------------------


def outside_repository(setup: Setup) -> Path:
    """A repository outside the workspace with a commit and a file the agent must not see."""
    outside = setup.tmp / "outside"
    setup.git(setup.tmp, "init", "-q", "-b", "main", str(outside))
    (outside / "secret.txt").write_text("the outside secret\n")
    setup.git(outside, "add", "secret.txt")
    setup.git(outside, "commit", "-q", "-m", "Outside commit")
    return outside


def borrowing_clone(setup: Setup, outside: Path, where: Path) -> None:
    """`where`: a clone sharing `outside`'s objects (`clone --shared` writes objects/info/alternates), whose index
    and working tree hold the outside file with a change, so git_diff would print it."""
    setup.git(setup.tmp, "clone", "-q", "--shared", str(outside), str(where))
    (where / "secret.txt").write_text("the outside secret, changed\n")


def plant(setup: Setup, workspace: Path, outside: Path, how: str) -> str:
    """Plant a way to read `outside`'s objects; the path the tools are then called with."""
    objects = outside / ".git" / "objects"
    repo = workspace / "repo"
    if how == "alternates":
        borrowing_clone(setup, outside, repo)
    elif how == "relative-alternates":
        borrowing_clone(setup, outside, repo)
        (repo / ".git/objects/info/alternates").write_text(os.path.relpath(objects, repo / ".git/objects") + "\n")
    elif how == "quoted-alternates":
        borrowing_clone(setup, outside, repo)
        quoted = '"' + str(objects).replace("/", "\\057") + '"'
        (repo / ".git/objects/info/alternates").write_text(f"# a comment\n{quoted}\n")
    elif how == "alternates-of-an-alternate":
        middle = workspace / "middle"
        setup.git(workspace, "init", "-q", "--bare", str(middle))
        (middle / "objects/info/alternates").write_text(f"{objects}\n")
        borrowing_clone(setup, outside, repo)
        (repo / ".git/objects/info/alternates").write_text(f"{middle / 'objects'}\n")
    elif how == "symlinked-objects":
        borrowing_clone(setup, outside, repo)
        (repo / ".git/objects/info/alternates").unlink()
        os.rename(repo / ".git/objects", repo / ".git/objects.real")
        (repo / ".git/objects").symlink_to(objects)
    elif how == "symlinked-pack":
        setup.git(outside, "gc", "-q")
        borrowing_clone(setup, outside, repo)
        (repo / ".git/objects/info/alternates").unlink()
        (repo / ".git/objects/pack").rmdir()
        (repo / ".git/objects/pack").symlink_to(objects / "pack")
    elif how == "http-alternates":
        borrowing_clone(setup, outside, repo)
        (repo / ".git/objects/info/http-alternates").write_text("https://sandstorm.invalid/x.git/objects\n")
    elif how == "gitfile":
        borrowing_clone(setup, outside, repo)
        os.rename(repo / ".git", workspace / "store.git")
        (repo / ".git").write_text("gitdir: ../store.git\n")
    elif how == "linked-worktree":
        borrowing_clone(setup, outside, workspace / "main")
        setup.git(workspace / "main", "worktree", "add", "-q", "-b", "side", str(repo))
        (repo / "secret.txt").write_text("the outside secret, changed\n")
    return "repo"


PLANTS = [
    "alternates",
    "relative-alternates",
    "quoted-alternates",
    "alternates-of-an-alternate",
    "symlinked-objects",
    "symlinked-pack",
    "http-alternates",
    "gitfile",
    "linked-worktree",
]


@pytest.mark.parametrize("how", PLANTS)
@pytest.mark.parametrize("tool", ["git_log", "git_diff", "git_status", "git_branch"])
async def test_a_repository_reading_objects_from_outside_the_workspace_is_refused(
    setup: Setup, workspace: Path, executor: GitExecutor, how: str, tool: str
) -> None:
    path = plant(setup, workspace, outside_repository(setup), how)
    with pytest.raises(ToolFailure) as refused:
        if tool == "git_log":
            await executor.git_log(5, path)
        elif tool == "git_branch":
            await executor.git_branch(None, path)
        else:
            await getattr(executor, tool)(path)
    text = str(refused.value)
    assert "is refused: its repository reads objects from outside the workspace" in text
    assert "Outside commit" not in text and "outside secret" not in text


async def test_alternates_inside_the_workspace_are_read(setup: Setup, workspace: Path, executor: GitExecutor) -> None:
    inside = workspace / "inside"
    setup.git(workspace, "init", "-q", "-b", "main", str(inside))
    setup.git(inside, "commit", "-q", "--allow-empty", "-m", "Inside commit")
    setup.git(workspace, "clone", "-q", "--shared", str(inside), str(workspace / "repo"))
    assert (await executor.git_log(5, "repo")).endswith(" Inside commit")


@pytest.mark.parametrize("variable", ["GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_OBJECT_DIRECTORY"])
async def test_object_directory_variables_of_the_tool_environment_do_not_reach_git(
    setup: Setup, workspace: Path, executor: GitExecutor, variable: str
) -> None:
    outside = outside_repository(setup)
    setup.git(workspace, "init", "-q", "-b", "main", str(workspace / "repo"))
    (workspace / "repo/.git/refs/heads/main").write_text(setup.git(outside, "rev-parse", "HEAD"))
    executor.env = {**executor.env, variable: str(outside / ".git" / "objects")}
    with pytest.raises(ToolFailure) as failed:
        await executor.git_log(5, "repo")
    assert "Outside commit" not in str(failed.value)


# --- git_push and the repository's push settings ---------------------------------------------------------------------


def diverge(setup: Setup, repo: Path, remote: Path) -> str:
    """Put a commit on the remote's main that the local main lacks; the remote's main, which a force would lose."""
    setup.git(repo, "commit", "-q", "--allow-empty", "-m", "Remote only")
    setup.git(repo, "push", "-q", "origin", "main")
    setup.git(repo, "reset", "-q", "--hard", "HEAD~1")
    setup.git(repo, "commit", "-q", "--allow-empty", "-m", "Local only")
    return setup.git(remote, "rev-parse", "main").strip()


@pytest.mark.parametrize("branch", [None, "main"])
@pytest.mark.parametrize("refspec", ["+refs/heads/main:refs/heads/main", "+refs/heads/*:refs/heads/*", "+main"])
async def test_a_push_refspec_that_forces_is_not_used(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path, refspec: str, branch: str | None
) -> None:
    kept = diverge(setup, repo, remote)
    setup.git(repo, "config", "remote.origin.push", refspec)
    with pytest.raises(ToolFailure) as refused:
        await executor.git_push("origin", branch, "repo")
    assert "rejected" in str(refused.value)
    assert f"Note: this repository's push settings were not used (remote.origin.push = {refspec})" in str(refused.value)
    assert setup.git(remote, "rev-parse", "main").strip() == kept


@pytest.mark.parametrize("setting", [("remote.origin.mirror", "true"), ("remote.origin.push", ":refs/heads/keep")])
async def test_a_push_setting_that_deletes_remote_branches_is_not_used(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path, setting: tuple[str, str]
) -> None:
    setup.git(repo, "push", "-q", "origin", "main:keep")
    setup.git(repo, "config", *setting)
    setup.git(repo, "commit", "-q", "--allow-empty", "-m", "New")
    output = await executor.git_push("origin", None, "repo")
    assert "main -> main" in output and f"{setting[0]} = {setting[1]}" in output
    assert "refs/heads/keep" in setup.git(remote, "for-each-ref", "--format=%(refname)")
    assert setup.git(remote, "log", "-1", "--format=%s", "main") == "New\n"


async def test_a_mirror_setting_for_a_remote_given_as_a_url_is_not_used(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path
) -> None:
    kept = diverge(setup, repo, remote)
    setup.git(repo, "push", "-q", "origin", "main~1:refs/heads/keep")
    url = f"file://{remote}"
    setup.git(repo, "config", f"remote.{url}.mirror", "true")
    setup.git(repo, "config", f"remote.{url}.push", "+refs/heads/*:refs/heads/*")
    with pytest.raises(ToolFailure, match="rejected"):
        await executor.git_push(url, "main", "repo")
    assert setup.git(remote, "rev-parse", "main").strip() == kept
    assert "refs/heads/keep" in setup.git(remote, "for-each-ref", "--format=%(refname)")


async def test_a_push_without_a_branch_pushes_the_checked_out_one_and_refuses_a_detached_head(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path
) -> None:
    setup.git(repo, "checkout", "-q", "-b", "topic")
    setup.git(repo, "commit", "-q", "--allow-empty", "-m", "On topic")
    assert "topic -> topic" in await executor.git_push("origin", None, "repo")
    assert setup.git(remote, "log", "-1", "--format=%s", "topic") == "On topic\n"
    setup.git(repo, "checkout", "-q", "--detach")
    with pytest.raises(ToolFailure, match="no branch is checked out"):
        await executor.git_push("origin", None, "repo")
