"""The kernel's sandbox under tool processes (mcpserver/executor/confinement.py, landlock.py), in this process.

Each profile is checked by what a process started in it can and cannot do, with the git layer's own defences out
of the way (git run directly), so that what holds here holds because of the kernel. The hostile repositories are
built in the test. tests/test_kernel_confinement_live.py checks the same through a real server and credentials.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpserver.executor import confinement, landlock, sandbox_rules
from mcpserver.executor.confinement import HOST, PROBE, READ, WORKSPACE
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.local import LocalExecutor

try:
    landlock.abi_version()
    LANDLOCK = True
except landlock.LandlockUnavailable:
    LANDLOCK = False
needs_landlock = pytest.mark.skipif(not LANDLOCK, reason="this kernel has no Landlock")

GIT_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
GIT_ENV |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def places(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A workspace with a repository, a hidden state dir holding a key, and a directory outside both."""
    workspace, state, outside = tmp_path / "workspace", tmp_path / "state", tmp_path / "outside"
    for directory in (workspace, state, outside):
        directory.mkdir()
    (state / "secret_key").write_text("the server's key\n")
    (outside / "elsewhere.txt").write_text("outside\n")
    repo = workspace / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first")
    sandboxes = confinement.build(str(workspace.resolve()), [str(state)])
    confinement.configure(sandboxes)
    yield {"workspace": workspace, "state": state, "outside": outside, "repo": repo}
    confinement.configure(confinement.build(str(workspace), [], enabled=False))


def run(profile: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`argv` started as spawn.py starts a tool process of `profile`: from that profile's sandboxed thread."""
    sandboxes = confinement.active()
    env = sandboxes.environment(profile, {"PATH": os.environ["PATH"], "HOME": os.path.expanduser("~")})

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )

    process = sandboxes.start(profile, start)
    stdout, stderr = process.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def sh(profile: str, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(profile, ["sh", "-c", script], cwd)


# --- the module's own pieces ----------------------------------------------------------------------------------------


def test_readable_except_covers_everything_but_the_hidden_trees(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "state").mkdir(parents=True)
    (project / "workspace").mkdir()
    (project / "README").write_text("x")
    (tmp_path / "sibling").mkdir()
    allowed = sandbox_rules.readable_except([str(project / "state")])
    assert str(project / "state") not in allowed
    assert str(project) not in allowed and str(tmp_path) not in allowed  # ancestors: only their other entries
    assert {str(project / "workspace"), str(project / "README"), str(tmp_path / "sibling")} <= set(allowed)
    assert "/usr" in allowed and "/etc" in allowed
    assert sandbox_rules.readable_except([]) == ["/"]


def test_profile_for_reads_whatever_the_server_asked() -> None:
    assert confinement.profile_for("git_status", HOST) == READ
    assert confinement.profile_for("grep", WORKSPACE) == READ
    assert confinement.profile_for("workspace_info", HOST) == PROBE
    assert confinement.profile_for("list_dir", WORKSPACE) == PROBE
    assert confinement.profile_for("run_command", WORKSPACE) == WORKSPACE
    assert confinement.profile_for("run_command", READ) == READ
    assert confinement.profile_for("run_command", None) == HOST  # a server from before profiles
    with pytest.raises(ValueError, match="unknown confinement profile"):
        confinement.profile_for("run_command", "probe")


def test_turned_off_refuses_workspace_and_lets_reads_fall_back(tmp_path: Path) -> None:
    sandboxes = confinement.build(str(tmp_path), [], enabled=False)
    try:
        assert sandboxes.describe()["profiles"] == {
            READ: "turned off (SANDSTORM_KERNEL_CONFINEMENT=off)",
            WORKSPACE: "turned off (SANDSTORM_KERNEL_CONFINEMENT=off)",
        }
        started: list[str] = []
        with pytest.raises(ToolFailure, match="confined to its workspace, but this host cannot enforce that"):
            sandboxes.start(WORKSPACE, lambda: started.append("workspace"))
        assert started == []  # nothing ran
        sandboxes.start(READ, lambda: started.append("read"))  # unconfined: the git layer's defences alone
        assert started == ["read"]
    finally:
        sandboxes.close()


@needs_landlock
def test_a_bound_thread_is_confined_and_the_rest_of_the_process_is_not(places: dict[str, Path]) -> None:
    target = places["outside"] / "written"
    done = run(READ, ["git", "init", "-q", str(target)], places["workspace"])
    assert done.returncode != 0 and not target.exists()
    target.write_text("this thread may write")  # the pytest thread itself is not bound
    assert target.read_text() == "this thread may write"


# --- read: only git and rg, nothing written, nothing read outside -----------------------------------------------------


@needs_landlock
def test_read_runs_git_and_nothing_else(places: dict[str, Path]) -> None:
    repo = places["repo"]
    assert "On branch main" in run(READ, ["git", "status"], repo).stdout
    for argv in (["sh", "-c", "true"], ["cat", "a.txt"], ["python3", "-c", "1"]):
        with pytest.raises(PermissionError):
            run(READ, argv, repo)


@needs_landlock
def test_read_writes_nothing_even_inside_the_workspace(places: dict[str, Path]) -> None:
    repo = places["repo"]
    done = run(READ, ["git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "--allow-empty", "-m", "x"], repo)
    assert done.returncode != 0
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"
    assert not (repo / ".git" / "index.lock").exists()


@needs_landlock
def test_read_cannot_run_a_repository_filter_even_with_the_git_layer_bypassed(places: dict[str, Path]) -> None:
    """The submodule filter of the attack, and the plain filter, fsmonitor and pager spellings: git run raw, with no
    overrides, in the read sandbox. Whatever the spelling, the program cannot run, or runs unable to write."""
    repo, marker = places["repo"], places["workspace"] / "MARK"
    sub = repo / "sub"
    sub.mkdir()
    git(sub, "init", "-q", "-b", "main")
    (sub / ".gitattributes").write_text("* filter=evil\n")
    (sub / "f.txt").write_text("content\n")
    git(sub, "add", ".")
    git(sub, "commit", "-q", "-m", "sub")
    git(sub, "config", "filter.evil.clean", f"sh -c 'touch {marker}; cat'")  # after the commit: not run here
    os.utime(sub / "f.txt", (1, 1))
    head = git(sub, "rev-parse", "HEAD").strip()
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},sub")
    git(repo, "config", "core.fsmonitor", f"touch {marker}")
    git(repo, "config", "core.pager", f"touch {marker}")
    git(repo, "config", "filter.direct.clean", f"/lib64/ld-linux-x86-64.so.2 /usr/bin/touch {marker}")
    (repo / ".gitattributes").write_text("* filter=direct\n")
    os.utime(repo / "a.txt", (1, 1))
    for argv in (["git", "status"], ["git", "diff"], ["git", "-p", "log"]):
        run(READ, argv, repo)
    assert not marker.exists()
    run(HOST, ["git", "status"], repo)  # the control: unconfined, a filter runs
    assert marker.exists()


@needs_landlock
def test_read_cannot_read_an_alternate_outside_the_workspace(places: dict[str, Path]) -> None:
    """A planted alternates entry naming a repository outside: its objects cannot be read in the read sandbox."""
    other = places["outside"] / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    (other / "private.txt").write_text("the other repository's secret\n")
    git(other, "add", ".")
    git(other, "commit", "-q", "-m", "private")
    commit = git(other, "rev-parse", "HEAD").strip()
    repo = places["repo"]
    (repo / ".git" / "objects" / "info" / "alternates").write_text(f"{other}/.git/objects\n")
    confined = run(READ, ["git", "show", f"{commit}:private.txt"], repo)
    assert "secret" not in confined.stdout and confined.returncode != 0
    assert "secret" in run(HOST, ["git", "show", f"{commit}:private.txt"], repo).stdout  # the control


@needs_landlock
def test_read_reaches_no_tcp_port(places: dict[str, Path]) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        done = run(READ, ["git", "ls-remote", f"http://127.0.0.1:{port}/x.git"], places["repo"])
    assert done.returncode != 0
    assert "Permission denied" in done.stderr or "Failed to connect" in done.stderr


@needs_landlock
def test_the_probes_of_workspace_info_run_and_write_nothing(places: dict[str, Path]) -> None:
    assert run(PROBE, ["uname", "-s"], places["workspace"]).stdout.strip() == "Linux"
    with pytest.raises(PermissionError):
        run(PROBE, ["sh", "-c", "true"], places["workspace"])


# --- workspace: writes only in the workspace and its TMPDIR; the hidden trees out of reach --------------------------


@needs_landlock
def test_workspace_writes_in_the_workspace_and_its_private_tmp_only(places: dict[str, Path]) -> None:
    workspace, outside = places["workspace"], places["outside"]
    done = sh(WORKSPACE, 'echo made > made.txt && echo t > "$TMPDIR/t" && cat "$TMPDIR/t"', workspace)
    assert done.returncode == 0, done.stderr
    assert (workspace / "made.txt").read_text() == "made\n" and done.stdout == "t\n"
    for target in (outside / "x", Path(os.path.expanduser("~")) / ".sandstorm-confinement-probe", Path("/tmp/x-ss")):
        done = sh(WORKSPACE, f"echo x > {target}", workspace)
        assert done.returncode != 0 and not target.exists(), target
    assert sh(WORKSPACE, f"cat {outside}/elsewhere.txt", workspace).stdout == "outside\n"  # reading elsewhere is fine


@needs_landlock
def test_workspace_cannot_read_or_change_the_hidden_state_dir(places: dict[str, Path]) -> None:
    state = places["state"]
    done = sh(WORKSPACE, f"cat {state}/secret_key; ls {state}; rm -f {state}/secret_key; echo x > {state}/new", state)
    assert "the server's key" not in done.stdout
    assert (state / "secret_key").exists() and not (state / "new").exists()
    assert done.stderr.count("Permission denied") >= 3


@needs_landlock
def test_workspace_gains_no_privileges_and_says_so(places: dict[str, Path]) -> None:
    done = sh(WORKSPACE, "sudo -n id", places["workspace"])
    assert done.returncode != 0
    assert "this credential is confined to its workspace" in done.stderr
    assert "NoNewPrivs:\t1" in sh(WORKSPACE, "grep NoNewPrivs /proc/self/status", places["workspace"]).stdout


@needs_landlock
def test_workspace_cannot_signal_or_read_the_executor(places: dict[str, Path]) -> None:
    me = os.getpid()
    done = sh(WORKSPACE, f"kill -0 {me}; cat /proc/{me}/environ", places["workspace"])
    assert done.returncode != 0
    assert "PATH=" not in done.stdout
    assert sh(HOST, f"kill -0 {me} && echo alive", places["workspace"]).stdout == "alive\n"  # the control


@needs_landlock
def test_a_workspace_call_through_the_executor(places: dict[str, Path]) -> None:
    """run_command with the profile set as the executor's service sets it for a request."""
    executor = LocalExecutor(str(places["workspace"]))

    async def call() -> tuple[str, str]:
        confinement.PROFILE.set(WORKSPACE)
        result = await executor.run_command(f"touch ok; cat {places['state']}/secret_key", None, 20, 10_000, None)
        return result.stdout, result.stderr

    stdout, stderr = asyncio.run(call())
    assert (places["workspace"] / "ok").exists()
    assert "the server's key" not in stdout and "Permission denied" in stderr


@needs_landlock
def test_a_background_job_runs_in_its_credentials_sandbox(places: dict[str, Path]) -> None:
    """start_background: the job host (the executor's own code) is unconfined and holds the job's files; the command
    it starts is bound to the workspace sandbox before it runs."""
    executor = LocalExecutor(str(places["workspace"]))
    script = f'cat {places["state"]}/secret_key; echo t > "$TMPDIR/t" && echo tmp-ok; echo x > {places["outside"]}/x'

    async def job() -> str:
        confinement.PROFILE.set(WORKSPACE)
        started = await executor.start_background(script, None)
        found = await executor.job_output(
            started.log_path, started.pid, started.start_ticks, 0, None, 100_000, 5000, True
        )
        return str(found.get("output", found))

    output = asyncio.run(job())
    assert "tmp-ok" in output and "the server's key" not in output
    assert "Permission denied" in output and not (places["outside"] / "x").exists()


def test_a_background_job_of_an_unenforceable_workspace_profile_is_not_started(tmp_path: Path) -> None:
    confinement.configure(confinement.build(str(tmp_path), [], enabled=False))
    executor = LocalExecutor(str(tmp_path))

    async def job() -> None:
        confinement.PROFILE.set(WORKSPACE)
        await executor.start_background(f"touch {tmp_path}/ran", None)

    with pytest.raises(ToolFailure, match="this host cannot enforce that"):
        asyncio.run(job())
    assert not (tmp_path / "ran").exists()


@needs_landlock
def test_an_entry_made_beside_a_hidden_tree_after_the_start_is_readable(places: dict[str, Path]) -> None:
    """The rules list the directories on the way to a hidden tree when they are built; a later entry there (a
    remote a user clones from, next to the server's state) gets them built again."""
    later = places["state"].parent / "made-later"
    later.mkdir()
    (later / "f.txt").write_text("later\n")
    assert sh(WORKSPACE, f"cat {later}/f.txt", places["workspace"]).stdout == "later\n"
    assert "the server's key" not in sh(WORKSPACE, f"cat {places['state']}/secret_key", places["workspace"]).stdout


def test_the_service_runs_every_read_operation_in_the_read_sandbox_whatever_the_server_asked(tmp_path: Path) -> None:
    """The executor's service sets the profile per request: a read operation gets `read` even when the server sent
    `host` (a full credential set to host), and an operation that writes gets what the server sent."""
    from mcpserver.executor.service import ExecutorService

    executor = LocalExecutor(str(tmp_path))
    seen: list[str] = []

    async def note(*_args: object, **_kwargs: object) -> str:
        seen.append(confinement.PROFILE.get())
        return ""

    for operation in ("git_status", "grep", "run_command"):
        setattr(executor, operation, note)
    service = ExecutorService(executor, os.getuid())

    async def ask(op: str, requested: str | None) -> dict[str, object]:
        request: dict[str, object] = {"op": op, "args": {}}
        if requested is not None:
            request["confinement"] = requested
        return await service._result(request, None)  # type: ignore[arg-type]  # no stream: run_command's listener off

    async def asks() -> list[dict[str, object]]:
        return [
            await ask("git_status", HOST),
            await ask("grep", WORKSPACE),
            await ask("run_command", WORKSPACE),
            await ask("run_command", None),
            await ask("run_command", "probe"),
        ]

    answers = asyncio.run(asks())
    assert seen == [READ, READ, WORKSPACE, HOST]
    assert answers[-1] == {"error": "unknown confinement profile 'probe'"}


@needs_landlock
def test_a_sandbox_the_kernel_refuses_to_bind_is_unavailable_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> None:
        raise PermissionError(1, "Operation not permitted", "capset")

    monkeypatch.setattr(landlock, "drop_capabilities", refuse)
    sandboxes = confinement.build(str(tmp_path), [])
    try:
        said = sandboxes.describe()["profiles"]
        assert said == {
            READ: "could not bind a thread to the sandbox: [Errno 1] Operation not permitted: 'capset'",
            WORKSPACE: "could not bind a thread to the sandbox: [Errno 1] Operation not permitted: 'capset'",
        }
        with pytest.raises(ToolFailure, match="Operation not permitted"):
            sandboxes.start(WORKSPACE, lambda: None)
    finally:
        sandboxes.close()
