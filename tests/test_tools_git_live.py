"""The nine git tools over MCP against the live server, with a real bare remote reached by file:// URLs.

Also that no value an agent passes (branch, remote, URL) reaches git as an option or a remote helper.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest
from mcp import Client

from tests.live import LiveServer, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

HASH_AND_SUBJECT = re.compile(r"[0-9a-f]{7,40} .+")


def git(env: dict[str, str], cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


async def call(client: Client, tool: str, **arguments: object) -> tuple[str, bool]:
    result = await client.call_tool(tool, arguments)
    return text_of(result), bool(result.is_error)


@pytest.fixture
def repo(workspace_dir: Path, bare_remote: Path, git_env: dict[str, str]) -> Path:
    """A clone of `bare_remote` inside the workspace (made with plain git), on `main`, clean."""
    path = workspace_dir / "repo"
    git(git_env, workspace_dir, "clone", "-q", bare_remote.as_uri(), str(path))
    return path


def head_branch(env: dict[str, str], repo: Path) -> str:
    return git(env, repo, "rev-parse", "--abbrev-ref", "HEAD").strip()


# --- the tools at work -----------------------------------------------------------------------------------------------


async def test_clone_commit_push_and_pull_round_trip_through_a_bare_remote(
    live_server: LiveServer, workspace_dir: Path, bare_remote: Path, git_env: dict[str, str], tmp_path: Path
) -> None:
    # Profile `host`: a `workspace` credential may not write a bare repository outside the workspace (the test
    # after this one); a network remote is where its pushes go.
    host = live_server.manage("create_token", f"git-host-{uuid.uuid4().hex[:8]}", "--confinement", "host")
    async with mcp_client(live_server.mcp_url, host.stdout.split()[-1]) as tools_client:
        await _round_trip(tools_client, workspace_dir, bare_remote, git_env, tmp_path)


async def test_a_workspace_credential_cannot_push_into_a_repository_outside_the_workspace(
    tools_client: Client, workspace_dir: Path, bare_remote: Path, git_env: dict[str, str]
) -> None:
    before = git(git_env, bare_remote, "rev-parse", "main")
    clone = workspace_dir / "confined"
    text, is_error = await call(tools_client, "git_clone", repo_url=bare_remote.as_uri(), path=str(clone))
    assert not is_error, text  # reading outside the workspace is allowed
    (clone / "x.txt").write_text("x\n")
    await call(tools_client, "git_commit", message="x", path=str(clone))
    text, is_error = await call(tools_client, "git_push", path=str(clone))
    assert is_error and "unable to create temporary object directory" in text, text  # the remote's side, confined
    assert git(git_env, bare_remote, "rev-parse", "main") == before


async def _round_trip(
    tools_client: Client, workspace_dir: Path, bare_remote: Path, git_env: dict[str, str], tmp_path: Path
) -> None:
    clone = workspace_dir / "work"
    text, is_error = await call(tools_client, "git_clone", repo_url=bare_remote.as_uri(), path=str(clone))
    assert not is_error and "Cloning into" in text
    assert (clone / "README.md").read_text() == "seed\n"

    text, is_error = await call(tools_client, "git_status", path=str(clone))
    assert not is_error and "On branch main" in text and "nothing to commit, working tree clean" in text

    (clone / "notes.txt").write_text("from the agent\n")
    text, is_error = await call(tools_client, "git_status", path=str(clone))
    assert not is_error and "Untracked files" in text and "notes.txt" in text
    text, is_error = await call(tools_client, "git_commit", message="Add notes", path=str(clone))
    assert not is_error and "Add notes" in text and "1 file changed" in text

    text, is_error = await call(tools_client, "git_push", path=str(clone))
    assert not is_error and "main -> main" in text
    assert git(git_env, bare_remote, "log", "-1", "--format=%s").strip() == "Add notes"

    elsewhere = tmp_path / "elsewhere"
    git(git_env, tmp_path, "clone", "-q", str(bare_remote), str(elsewhere))
    (elsewhere / "other.txt").write_text("from another clone\n")
    git(git_env, elsewhere, "add", "other.txt")
    git(git_env, elsewhere, "commit", "-q", "-m", "From elsewhere")
    git(git_env, elsewhere, "push", "-q", "origin", "main")

    text, is_error = await call(tools_client, "git_pull", path=str(clone))
    assert not is_error and "Fast-forward" in text and "other.txt" in text
    assert (clone / "other.txt").read_text() == "from another clone\n"

    text, is_error = await call(tools_client, "git_log", path=str(clone))
    assert not is_error
    assert text.splitlines() == git(git_env, clone, "log", "--format=%h %s").splitlines()
    assert [line.split(" ", 1)[1] for line in text.splitlines()] == ["From elsewhere", "Add notes", "Initial commit"]
    assert all(HASH_AND_SUBJECT.fullmatch(line) for line in text.splitlines())
    text, is_error = await call(tools_client, "git_log", n=1, path=str(clone))
    assert not is_error and len(text.splitlines()) == 1 and text.endswith(" From elsewhere")


async def test_git_clone_of_a_branch_goes_into_a_directory_named_after_the_repository(
    tools_client: Client, live_server: LiveServer, bare_remote: Path, git_env: dict[str, str]
) -> None:
    git(git_env, bare_remote, "branch", "stable", "main")
    name = f"named-{uuid.uuid4().hex[:12]}"
    url = bare_remote.rename(bare_remote.with_name(f"{name}.git")).as_uri()
    text, is_error = await call(tools_client, "git_clone", repo_url=url, branch="stable")
    assert not is_error, text
    assert head_branch(git_env, live_server.workspace / name) == "stable"


async def test_git_diff_shows_unstaged_changes_or_says_no_changes(tools_client: Client, repo: Path) -> None:
    assert await call(tools_client, "git_diff", path=str(repo)) == ("(no changes)", False)
    (repo / "README.md").write_text("seed\nmore\n")
    text, is_error = await call(tools_client, "git_diff", path=str(repo))
    assert not is_error and "diff --git a/README.md b/README.md" in text and "\n+more" in text


async def test_git_branch_creates_and_lists_branches_and_git_checkout_switches(
    tools_client: Client, repo: Path, git_env: dict[str, str]
) -> None:
    text, is_error = await call(tools_client, "git_branch", name="feature-x", path=str(repo))
    assert not is_error
    text, is_error = await call(tools_client, "git_branch", path=str(repo))
    lines = [line.strip() for line in text.splitlines()]
    assert not is_error and "* main" in lines and "feature-x" in lines and "remotes/origin/main" in lines
    text, is_error = await call(tools_client, "git_checkout", branch="feature-x", path=str(repo))
    assert not is_error and "Switched to branch 'feature-x'" in text
    assert head_branch(git_env, repo) == "feature-x"


# --- failures --------------------------------------------------------------------------------------------------------

NOT_A_REPOSITORY_CALLS = [
    ("git_status", {}),
    ("git_commit", {"message": "m"}),
    ("git_push", {}),
    ("git_pull", {}),
    ("git_branch", {}),
    ("git_checkout", {"branch": "main"}),
    ("git_diff", {}),
    ("git_log", {}),
]


@pytest.mark.parametrize(("tool", "arguments"), NOT_A_REPOSITORY_CALLS, ids=[c[0] for c in NOT_A_REPOSITORY_CALLS])
async def test_git_tools_in_a_directory_that_is_no_repository_say_so(
    tools_client: Client, workspace_dir: Path, tool: str, arguments: dict[str, object]
) -> None:
    assert await call(tools_client, tool, **arguments, path=str(workspace_dir)) == (
        f"Error: {workspace_dir} is not a git repository",
        True,
    )


async def test_git_clone_of_a_missing_repository_is_an_error(
    tools_client: Client, workspace_dir: Path, tmp_path: Path
) -> None:
    text, is_error = await call(
        tools_client, "git_clone", repo_url=(tmp_path / "nothing.git").as_uri(), path=str(workspace_dir / "c")
    )
    assert is_error and text.startswith("Error: ") and "fatal:" in text
    assert not (workspace_dir / "c").exists()


async def test_git_commit_with_nothing_to_commit_is_an_error(tools_client: Client, repo: Path) -> None:
    text, is_error = await call(tools_client, "git_commit", message="Empty", path=str(repo))
    assert is_error and "nothing to commit" in text


async def test_git_push_to_an_unknown_remote_is_an_error(tools_client: Client, repo: Path) -> None:
    assert await call(tools_client, "git_push", remote="upstream", path=str(repo)) == (
        "Error: 'upstream' is neither a remote of this repository (remotes: origin) nor a URL",
        True,
    )


async def test_git_pull_of_a_missing_branch_is_an_error(tools_client: Client, repo: Path) -> None:
    text, is_error = await call(tools_client, "git_pull", branch="no-such-branch", path=str(repo))
    assert is_error and "couldn't find remote ref no-such-branch" in text


async def test_git_branch_that_exists_and_git_checkout_of_a_missing_branch_are_errors(
    tools_client: Client, repo: Path
) -> None:
    text, is_error = await call(tools_client, "git_branch", name="main", path=str(repo))
    assert is_error and "already exists" in text
    text, is_error = await call(tools_client, "git_checkout", branch="no-such-branch", path=str(repo))
    assert is_error and "fatal:" in text and "no-such-branch" in text


async def test_git_log_needs_a_positive_count(tools_client: Client, repo: Path) -> None:
    assert await call(tools_client, "git_log", n=0, path=str(repo)) == ("Error: n must be at least 1 (got 0)", True)


# --- option injection (a weakness of the earlier server) -------------------------------------------------------------


async def test_an_option_as_branch_name_is_refused_by_git_branch_and_git_checkout(
    tools_client: Client, repo: Path, git_env: dict[str, str]
) -> None:
    for tool in ("git_branch", "git_checkout"):
        key = "name" if tool == "git_branch" else "branch"
        text, is_error = await call(tools_client, tool, **{key: "--orphan=x"}, path=str(repo))
        assert is_error and "must not start with '-'" in text, (tool, text)
    assert head_branch(git_env, repo) == "main"
    assert git(git_env, repo, "branch", "--list", "--format=%(refname:short)").split() == ["main"]
    assert git(git_env, repo, "status", "--porcelain") == ""


INJECTIONS = [
    ("git_push", "--upload-pack=touch {marker}", None),
    ("git_push", "--receive-pack=touch {marker}", None),
    ("git_push", "--exec=touch {marker}", None),
    ("git_push", "origin", "--receive-pack=touch {marker}"),
    ("git_pull", "--upload-pack=touch {marker}", None),
    ("git_pull", "origin", "--upload-pack=touch {marker}"),
]


@pytest.mark.parametrize(("tool", "remote", "branch"), INJECTIONS)
async def test_a_pack_program_option_as_remote_or_branch_is_refused_and_runs_nothing(
    tools_client: Client, repo: Path, tmp_path: Path, tool: str, remote: str, branch: str | None
) -> None:
    marker = tmp_path / "pwned"
    arguments: dict[str, object] = {"remote": remote.format(marker=marker), "path": str(repo)}
    if branch is not None:
        arguments["branch"] = branch.format(marker=marker)
    text, is_error = await call(tools_client, tool, **arguments)
    assert is_error and "must not start with '-'" in text, text
    assert not marker.exists()


async def test_git_clone_refuses_ext_urls_and_options_and_runs_nothing(
    tools_client: Client, workspace_dir: Path, bare_remote: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    attempts = [
        {"repo_url": f"ext::sh -c touch% {marker}"},
        {"repo_url": f"--upload-pack=touch {marker}"},
        {"repo_url": bare_remote.as_uri(), "branch": f"--upload-pack=touch {marker}"},
    ]
    for arguments in attempts:
        text, is_error = await call(tools_client, "git_clone", **arguments, path=str(workspace_dir / "clone"))
        assert is_error and text.startswith("Error: invalid "), (arguments, text)
    assert not marker.exists()
    assert not (workspace_dir / "clone").exists()
