"""The git tools of the executor, against real repositories: a workspace clone and a bare remote outside it."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpserver.executor import git as git_module
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.git import GitOps
from mcpserver.executor.gitargs import directory_name_from_url
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.savedoutput import SavedOutput


class GitExecutor(GitOps):
    def __init__(self, root: Path, home: Path) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = {**clean_environment(), "HOME": str(home)}  # a HOME without ~/.gitconfig: no identity
        self.saved_output = SavedOutput(self.workspace)


def setup_env(home: Path) -> dict[str, str]:
    """The environment of the test's own git commands (not the executor's)."""
    return {
        **clean_environment(),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env = setup_env(self.home)

    def git(self, cwd: Path, *args: str) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, env=self.env, capture_output=True, text=True, check=True)
        return done.stdout


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


@pytest.fixture
def workspace(setup: Setup) -> Path:
    root = setup.tmp / "ws"
    root.mkdir()
    return root


@pytest.fixture
def remote(setup: Setup) -> Path:
    bare = setup.tmp / "remote.git"
    setup.git(setup.tmp, "init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    return bare


@pytest.fixture
def repo(setup: Setup, workspace: Path, remote: Path) -> Path:
    """`<workspace>/repo`: one commit on main, pushed to the bare remote, which is its `origin`."""
    path = workspace / "repo"
    setup.git(workspace, "init", "--quiet", "--initial-branch=main", str(path))
    (path / "README.md").write_text("hello\n")
    setup.git(path, "add", "README.md")
    setup.git(path, "commit", "--quiet", "-m", "Initial commit")
    setup.git(path, "remote", "add", "origin", str(remote))
    setup.git(path, "push", "--quiet", "-u", "origin", "main")
    return path


@pytest.fixture
def executor(setup: Setup, workspace: Path) -> GitExecutor:
    return GitExecutor(workspace, setup.home)


def head(setup: Setup, path: Path) -> str:
    return setup.git(path, "rev-parse", "HEAD").strip()


def branches(setup: Setup, path: Path) -> str:
    return setup.git(path, "for-each-ref", "--format=%(refname)")


# --- finding the repository ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_status_reports_the_branch_and_a_clean_tree(executor: GitExecutor, repo: Path) -> None:
    status = await executor.git_status("repo")
    assert "On branch main" in status
    assert "nothing to commit, working tree clean" in status


@pytest.mark.anyio
async def test_status_writes_nothing_in_the_repository_not_even_its_index(executor: GitExecutor, repo: Path) -> None:
    # git_status is a read: its audit records are committed after it ran, so it must change nothing. A file whose
    # mtime moved makes git refresh the index on status unless optional locks are off.
    index = repo / ".git" / "index"
    before = index.read_bytes()
    os.utime(repo / "README.md", (1_000_000_000, 1_000_000_000))
    assert "nothing to commit" in await executor.git_status("repo")
    assert index.read_bytes() == before


@pytest.mark.anyio
async def test_status_from_a_subdirectory_finds_the_enclosing_repository(executor: GitExecutor, repo: Path) -> None:
    (repo / "src").mkdir()
    assert "On branch main" in await executor.git_status("repo/src")


@pytest.mark.anyio
async def test_status_of_a_directory_that_is_not_a_repository_is_refused(
    executor: GitExecutor, workspace: Path
) -> None:
    (workspace / "plain").mkdir()
    with pytest.raises(ToolFailure, match=r"^Error: .*plain is not a git repository$"):
        await executor.git_status("plain")


@pytest.mark.anyio
async def test_status_of_a_path_outside_the_workspace_is_refused(executor: GitExecutor, repo: Path) -> None:
    with pytest.raises(ToolFailure, match="outside the allowed directory"):
        await executor.git_status("..")


@pytest.mark.anyio
async def test_a_repository_above_the_workspace_is_never_found(setup: Setup) -> None:
    outer = setup.tmp / "outer"
    setup.git(setup.tmp, "init", "--quiet", str(outer))
    inner = outer / "nested" / "ws"
    inner.mkdir(parents=True)
    executor = GitExecutor(inner, setup.home)
    with pytest.raises(ToolFailure, match=r"is not a git repository"):
        await executor.git_status(None)
    # git itself, run the way the executor runs it, stops at the workspace too.
    result = await executor._run(inner, ["rev-parse", "--show-toplevel"])
    assert result.exit_code != 0 and "not a git repository" in result.stderr


@pytest.mark.anyio
async def test_a_git_file_pointing_outside_the_workspace_is_refused(
    setup: Setup, executor: GitExecutor, workspace: Path, remote: Path
) -> None:
    (workspace / "linked").mkdir()
    (workspace / "linked" / ".git").write_text(f"gitdir: {remote}\n")
    with pytest.raises(ToolFailure, match="is not a git repository"):
        await executor.git_status("linked")


@pytest.mark.anyio
async def test_repository_variables_in_the_environment_are_not_passed_to_git(
    executor: GitExecutor, repo: Path, remote: Path
) -> None:
    executor.env = {**executor.env, "GIT_DIR": str(remote)}
    assert "On branch main" in await executor.git_status("repo")


# --- commit ---------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_commit_stages_everything_and_commits(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    (repo / "README.md").write_text("changed\n")
    (repo / "new.txt").write_text("new\n")
    output = await executor.git_commit("Change things", "repo")
    assert "Change things" in output
    assert setup.git(repo, "status", "--porcelain") == ""
    assert setup.git(repo, "log", "-1", "--format=%s") == "Change things\n"


@pytest.mark.anyio
async def test_commit_with_nothing_to_commit_fails_with_gits_text(executor: GitExecutor, repo: Path) -> None:
    with pytest.raises(ToolFailure, match=r"^Error: (.|\n)*nothing to commit"):
        await executor.git_commit("Nothing", "repo")


@pytest.mark.anyio
async def test_commit_without_a_configured_identity_uses_the_agent_identity(
    setup: Setup, executor: GitExecutor, repo: Path
) -> None:
    (repo / "a.txt").write_text("a\n")
    await executor.git_commit("By the agent", "repo")
    assert setup.git(repo, "log", "-1", "--format=%an <%ae>") == "Sandstorm Agent <agent@sandstorm.invalid>\n"
    assert setup.git(repo, "config", "--list", "--local").count("user.") == 0  # only for that command


@pytest.mark.anyio
async def test_commit_keeps_the_repositorys_own_identity(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    setup.git(repo, "config", "user.name", "Ada")
    setup.git(repo, "config", "user.email", "ada@example.invalid")
    (repo / "a.txt").write_text("a\n")
    await executor.git_commit("By Ada", "repo")
    assert setup.git(repo, "log", "-1", "--format=%an <%ae>") == "Ada <ada@example.invalid>\n"


@pytest.mark.anyio
async def test_a_commit_message_that_looks_like_an_option_is_only_a_message(
    setup: Setup, executor: GitExecutor, repo: Path
) -> None:
    before = head(setup, repo)
    (repo / "a.txt").write_text("a\n")
    await executor.git_commit("--amend", "repo")
    assert setup.git(repo, "log", "-1", "--format=%s") == "--amend\n"
    assert setup.git(repo, "rev-parse", "HEAD~1").strip() == before


@pytest.mark.anyio
async def test_server_environment_does_not_reach_programs_git_runs(
    setup: Setup, executor: GitExecutor, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filter driver in the admin's own (global) config still runs, the way git-lfs does; with our environment.
    monkeypatch.setenv("SANDSTORM_SECRET_PROBE", "x")
    seen = repo.parent / "filter_env.txt"
    (setup.home / ".gitconfig").write_text(f'[filter "probe"]\n\tclean = "sh -c \'env > {seen}; cat\'"\n')
    (repo / ".gitattributes").write_text("*.txt filter=probe\n")
    (repo / "a.txt").write_text("a\n")
    output = await executor.git_commit("Filtered", "repo")
    assert "Note:" not in output
    assert "GIT_CEILING_DIRECTORIES=" in seen.read_text()  # the driver did run, with our environment
    assert "SANDSTORM_SECRET_PROBE" not in seen.read_text()


@pytest.mark.anyio
async def test_commit_runs_no_hook_and_says_so(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    marker = repo.parent / "hook_ran"
    for name in ("pre-commit", "commit-msg", "post-commit"):
        hook = repo / ".git" / "hooks" / name
        hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
        hook.chmod(0o755)
    (repo / "a.txt").write_text("a\n")
    output = await executor.git_commit("Unhooked", "repo")
    assert setup.git(repo, "log", "-1", "--format=%s") == "Unhooked\n"
    assert output.endswith(
        "Note: this repository's hooks were not run (pre-commit, commit-msg, post-commit): the git tools never run "
        "hooks; run git with terminal_exec to use them."
    )
    assert not marker.exists()


# --- push and pull --------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_push_sends_the_new_commit_to_the_remote(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path
) -> None:
    (repo / "a.txt").write_text("a\n")
    await executor.git_commit("To push", "repo")
    output = await executor.git_push(None, "main", "repo")
    assert "main -> main" in output
    assert setup.git(remote, "log", "-1", "--format=%s", "main") == "To push\n"


@pytest.mark.anyio
async def test_pull_fetches_a_commit_pushed_from_another_clone(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path
) -> None:
    other = setup.tmp / "other"
    setup.git(setup.tmp, "clone", "--quiet", str(remote), str(other))
    (other / "from_other.txt").write_text("other\n")
    setup.git(other, "add", "-A")
    setup.git(other, "commit", "--quiet", "-m", "From the other clone")
    setup.git(other, "push", "--quiet", "origin", "main")
    output = await executor.git_pull("origin", "main", "repo")
    assert "from_other.txt" in output
    assert (repo / "from_other.txt").read_text() == "other\n"


@pytest.mark.anyio
async def test_push_with_nothing_new_says_so(executor: GitExecutor, repo: Path) -> None:
    assert "Everything up-to-date" in await executor.git_push("origin", None, "repo")


@pytest.mark.anyio
async def test_push_of_a_missing_branch_fails_with_gits_text(executor: GitExecutor, repo: Path) -> None:
    with pytest.raises(ToolFailure, match="^Error: .*does not match any"):
        await executor.git_push("origin", "no-such-branch", "repo")


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["git_push", "git_pull"])
async def test_an_option_like_remote_is_refused_and_runs_nothing(
    executor: GitExecutor, repo: Path, setup: Setup, method: str
) -> None:
    marker = setup.tmp / "pwned"
    with pytest.raises(ToolFailure, match=r"^Error: invalid remote name '--upload-pack=.*': it must not start"):
        await getattr(executor, method)(f"--upload-pack=touch {marker}", None, "repo")
    assert not marker.exists()


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["git_push", "git_pull"])
async def test_a_remote_helper_url_as_remote_is_refused(
    executor: GitExecutor, repo: Path, setup: Setup, method: str
) -> None:
    marker = setup.tmp / "pwned"
    with pytest.raises(ToolFailure, match="remote helper"):
        await getattr(executor, method)(f"ext::sh -c touch% {marker}", None, "repo")
    assert not marker.exists()


@pytest.mark.anyio
async def test_an_unknown_remote_name_is_refused(executor: GitExecutor, repo: Path) -> None:
    with pytest.raises(ToolFailure, match=r"'upstream' is neither a remote of this repository \(remotes: origin\)"):
        await executor.git_push("upstream", None, "repo")


@pytest.mark.anyio
async def test_a_url_that_is_not_a_configured_remote_may_be_pushed_to(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path
) -> None:
    (repo / "a.txt").write_text("a\n")
    await executor.git_commit("Via URL", "repo")
    await executor.git_push(f"file://{remote}", "main", "repo")
    assert setup.git(remote, "log", "-1", "--format=%s", "main") == "Via URL\n"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("branch", "message"),
    [
        ("--force", "must not start with '-'"),
        ("+main", r"must not start with '\+'"),
        ("main:other", "check-ref-format"),
    ],
)
async def test_a_push_branch_that_is_not_a_plain_branch_name_is_refused(
    setup: Setup, executor: GitExecutor, repo: Path, remote: Path, branch: str, message: str
) -> None:
    before = branches(setup, remote)
    with pytest.raises(ToolFailure, match=message):
        await executor.git_push("origin", branch, "repo")
    assert branches(setup, remote) == before


# --- branch and checkout --------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_branch_creates_a_branch_and_lists_all_branches(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    assert await executor.git_branch("feature", "repo") == "Created branch feature"
    assert "refs/heads/feature" in branches(setup, repo)
    listing = await executor.git_branch(None, "repo")
    assert "* main" in listing and "feature" in listing and "remotes/origin/main" in listing


@pytest.mark.anyio
async def test_branch_that_already_exists_fails_with_gits_text(executor: GitExecutor, repo: Path) -> None:
    with pytest.raises(ToolFailure, match="^Error: .*already exists"):
        await executor.git_branch("main", "repo")


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["git_branch", "git_checkout"])
async def test_an_option_like_branch_name_is_refused_and_changes_nothing(
    setup: Setup, executor: GitExecutor, repo: Path, method: str
) -> None:
    before = (branches(setup, repo), setup.git(repo, "symbolic-ref", "HEAD"), head(setup, repo))
    with pytest.raises(ToolFailure, match=r"^Error: invalid branch name '--orphan=x': it must not start with '-'$"):
        await getattr(executor, method)("--orphan=x", "repo")
    assert (branches(setup, repo), setup.git(repo, "symbolic-ref", "HEAD"), head(setup, repo)) == before


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["a..b", "with space", "ends.lock", "x~1", ""])
async def test_a_branch_name_git_would_not_accept_is_refused(executor: GitExecutor, repo: Path, name: str) -> None:
    with pytest.raises(ToolFailure, match="invalid branch name"):
        await executor.git_branch(name, "repo")


@pytest.mark.anyio
async def test_checkout_switches_to_the_branch(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    await executor.git_branch("feature", "repo")
    assert "Switched to branch 'feature'" in await executor.git_checkout("feature", "repo")
    assert setup.git(repo, "symbolic-ref", "--short", "HEAD") == "feature\n"


@pytest.mark.anyio
async def test_checkout_of_a_missing_branch_fails_with_gits_text(executor: GitExecutor, repo: Path) -> None:
    with pytest.raises(ToolFailure, match="^Error: .*no-such-branch"):
        await executor.git_checkout("no-such-branch", "repo")


@pytest.mark.anyio
async def test_checkout_of_a_file_name_is_not_a_file_restore(executor: GitExecutor, repo: Path) -> None:
    (repo / "README.md").write_text("local edit\n")
    with pytest.raises(ToolFailure):
        await executor.git_checkout("README.md", "repo")
    assert (repo / "README.md").read_text() == "local edit\n"


# --- diff and log ---------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_diff_shows_unstaged_changes(executor: GitExecutor, repo: Path) -> None:
    (repo / "README.md").write_text("hello\nworld\n")
    diff = await executor.git_diff("repo")
    assert "+world" in diff and "README.md" in diff


@pytest.mark.anyio
async def test_diff_without_changes_says_so(executor: GitExecutor, repo: Path) -> None:
    assert await executor.git_diff("repo") == "(no changes)"


@pytest.mark.anyio
async def test_diff_outside_a_repository_is_refused(executor: GitExecutor, workspace: Path) -> None:
    with pytest.raises(ToolFailure, match="is not a git repository"):
        await executor.git_diff(None)


@pytest.mark.anyio
async def test_log_shows_one_line_per_commit_newest_first(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    setup.git(repo, "commit", "--quiet", "--allow-empty", "-m", "Second")
    lines = (await executor.git_log(10, "repo")).splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["Second", "Initial commit"]
    assert lines[0].split(" ", 1)[0] == setup.git(repo, "rev-parse", "--short", "HEAD").strip()


@pytest.mark.anyio
async def test_log_is_limited_to_n_and_at_most_100(setup: Setup, executor: GitExecutor, repo: Path) -> None:
    stream = "".join(
        f"commit refs/heads/main\ncommitter T <t@e.invalid> {1700000000 + i} +0000\ndata 6\nc{i:04d}\n\n"
        for i in range(105)
    )
    fast_import = ["git", "fast-import", "--quiet", "--force"]
    subprocess.run(fast_import, cwd=repo, env=setup.env, input=stream, text=True, check=True)
    assert len((await executor.git_log(3, "repo")).splitlines()) == 3
    assert len((await executor.git_log(1000, "repo")).splitlines()) == 100


@pytest.mark.anyio
@pytest.mark.parametrize("n", [0, -5])
async def test_log_with_n_below_one_is_refused(executor: GitExecutor, repo: Path, n: int) -> None:
    with pytest.raises(ToolFailure, match="n must be at least 1"):
        await executor.git_log(n, "repo")


@pytest.mark.anyio
async def test_log_of_an_empty_repository_says_there_are_no_commits(
    setup: Setup, executor: GitExecutor, workspace: Path
) -> None:
    setup.git(workspace, "init", "--quiet", "empty")
    assert await executor.git_log(10, "empty") == "(no commits yet)"


# --- clone ----------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_clone_into_the_default_directory(
    setup: Setup, executor: GitExecutor, workspace: Path, repo: Path, remote: Path
) -> None:
    output = await executor.git_clone(str(remote), None, None)
    assert "Cloning into" in output
    assert (workspace / "remote" / "README.md").read_text() == "hello\n"


@pytest.mark.anyio
async def test_clone_of_a_branch_into_a_given_path(
    setup: Setup, executor: GitExecutor, workspace: Path, repo: Path, remote: Path
) -> None:
    setup.git(repo, "switch", "--quiet", "-c", "feature")
    (repo / "feature.txt").write_text("f\n")
    setup.git(repo, "add", "-A")
    setup.git(repo, "commit", "--quiet", "-m", "Feature")
    setup.git(repo, "push", "--quiet", "origin", "feature")
    await executor.git_clone(f"file://{remote}", "deps/copy", "feature")
    copy = workspace / "deps" / "copy"
    assert (copy / "feature.txt").exists()
    assert setup.git(copy, "symbolic-ref", "--short", "HEAD") == "feature\n"


@pytest.mark.anyio
async def test_clone_of_a_missing_repository_fails_with_gits_text(executor: GitExecutor, setup: Setup) -> None:
    with pytest.raises(ToolFailure, match="^Error: .*does not exist"):
        await executor.git_clone(str(setup.tmp / "nowhere.git"), None, None)


@pytest.mark.anyio
async def test_clone_with_a_remote_helper_url_is_refused_and_runs_nothing(executor: GitExecutor, setup: Setup) -> None:
    marker = setup.tmp / "pwned"
    with pytest.raises(ToolFailure, match=r"^Error: invalid repository URL 'ext::.*remote helper"):
        await executor.git_clone(f"ext::sh -c touch% {marker}", "x", None)
    assert not marker.exists()


@pytest.mark.anyio
async def test_git_itself_refuses_remote_helpers_that_slip_past_our_checks(
    executor: GitExecutor, setup: Setup, workspace: Path
) -> None:
    marker = setup.tmp / "pwned"
    result = await executor._run(workspace, ["clone", f"ext::sh -c touch% {marker}", "x"])
    assert result.exit_code != 0 and not marker.exists()


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["--upload-pack=touch /tmp/pwned", "-u", "fd::3"])
async def test_clone_with_an_option_like_or_fd_url_is_refused(executor: GitExecutor, url: str) -> None:
    with pytest.raises(ToolFailure, match="^Error: invalid repository URL"):
        await executor.git_clone(url, "x", None)


@pytest.mark.anyio
async def test_clone_with_an_option_like_branch_is_refused(executor: GitExecutor, remote: Path) -> None:
    with pytest.raises(ToolFailure, match="must not start with '-'"):
        await executor.git_clone(str(remote), "x", "--upload-pack=touch")


@pytest.mark.anyio
async def test_clone_into_a_path_outside_the_workspace_is_refused(
    executor: GitExecutor, setup: Setup, remote: Path
) -> None:
    with pytest.raises(ToolFailure, match="outside the allowed directory"):
        await executor.git_clone(str(remote), str(setup.tmp / "escaped"), None)
    assert not (setup.tmp / "escaped").exists()


@pytest.mark.anyio
async def test_clone_through_a_symlink_out_of_the_workspace_is_refused(
    executor: GitExecutor, setup: Setup, workspace: Path, remote: Path
) -> None:
    outside = setup.tmp / "outside"
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    with pytest.raises(ToolFailure, match="outside the allowed directory"):
        await executor.git_clone(str(remote), "link/copy", None)
    assert list(outside.iterdir()) == []


@pytest.fixture
def silent_git_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers: a git:// clone from it hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.anyio
async def test_clone_that_takes_too_long_is_stopped(
    executor: GitExecutor, silent_git_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(git_module, "CLONE_TIMEOUT", 1.0)
    with pytest.raises(ToolFailure, match=r"^Error: git clone timed out after 1s$"):
        await executor.git_clone(f"git://127.0.0.1:{silent_git_server}/x.git", None, None)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://github.com/owner/project.git", "project"),
        ("https://github.com/owner/project/", "project"),
        ("git@github.com:owner/project.git", "project"),
        ("/srv/git/project/.git", "project"),
        ("file:///srv/remote.git", "remote"),
    ],
)
def test_the_default_clone_directory_is_the_last_url_component(url: str, name: str) -> None:
    assert directory_name_from_url(url) == name


def test_a_url_without_a_usable_name_needs_a_path() -> None:
    with pytest.raises(ToolFailure, match="pass `path`"):
        directory_name_from_url("https://host/..")
