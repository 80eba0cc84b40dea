"""The executor's workspace tools: workspace_info and install (package names never reach a shell)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpserver.executor.environment import clean_environment
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.savedoutput import SavedOutput
from mcpserver.executor.workspace import WorkspaceOps, choose_manager, install_command, validate_packages

HEADERS = [f"=== {name} ===" for name in ("OS", "Node", "Git", "Disk", "CWD", "Tools", "Memory")]


class _Executor(WorkspaceOps):
    def __init__(self, root: Path, path: str | None = None) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment()
        self.saved_output = SavedOutput(self.workspace)
        if path is not None:
            self.env["PATH"] = path


def fake_bin(directory: Path, name: str, script: str) -> None:
    directory.mkdir(exist_ok=True)
    program = directory / name
    program.write_text(f"#!/bin/bash\n{script}\n")
    program.chmod(0o755)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


# --- workspace_info ------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_workspace_info_has_all_seven_sections_in_order(workspace: Path) -> None:
    info = await _Executor(workspace).workspace_info()
    lines = info.splitlines()
    positions = [lines.index(header) for header in HEADERS]
    assert positions == sorted(positions)
    cwd = lines[lines.index("=== CWD ===") + 1]
    assert cwd == str(workspace.resolve())
    assert "git version" in info
    assert lines[lines.index("=== Tools ===") + 1].startswith("python3: ")


@pytest.mark.anyio
async def test_each_section_is_followed_by_a_blank_line(workspace: Path) -> None:
    info = await _Executor(workspace).workspace_info()
    for header in HEADERS[1:]:
        assert f"\n\n{header}\n" in info


@pytest.mark.anyio
async def test_workspace_info_says_what_is_missing(workspace: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    info = await _Executor(workspace, path=str(empty)).workspace_info()
    lines = info.splitlines()
    assert lines[lines.index("=== Node ===") + 1] == "not installed"
    assert lines[lines.index("=== Git ===") + 1] == "not installed"
    assert "docker: not found" in lines
    assert not (workspace / ".sandstorm").exists()  # a report creates nothing in the workspace


# --- install: validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        *("foo;rm -rf /", "-e", "--index-url=http://evil", "$(x)", "${HOME}", "`id`", "a b", "a\nb", "a\tb"),
        *("foo|bar", "x&y", "'q'", '"q"', "*", "pkg?", "(a)", "", ".", "/etc/passwd"),
    ],
)
def test_dangerous_package_names_are_refused(name: str) -> None:
    with pytest.raises(ToolFailure, match="^Error: invalid package name"):
        validate_packages([name])


@pytest.mark.parametrize(
    "name",
    [
        *("lodash", "@types/node@20", "requests>=2.31,<3", "numpy==2.1.0", "python3-venv", "foo[bar]"),
        *("left-pad@^1.3.0", "pkg~=1.0", "name!=2", "libfoo:amd64", "a_b.c+d"),
    ],
)
def test_ordinary_names_and_version_specs_are_accepted(name: str) -> None:
    validate_packages([name])


def test_no_packages_or_too_many_are_refused() -> None:
    with pytest.raises(ToolFailure, match="no packages"):
        validate_packages([])
    with pytest.raises(ToolFailure, match="at most 50"):
        validate_packages([f"pkg{i}" for i in range(51)])


@pytest.mark.anyio
@pytest.mark.parametrize("manager", ["brew", "npm; rm -rf /", "yum", "NPM"])
async def test_unknown_managers_are_refused(workspace: Path, manager: str) -> None:
    with pytest.raises(ToolFailure, match="unknown package manager"):
        await _Executor(workspace).install(["lodash"], manager)


@pytest.mark.anyio
async def test_install_refuses_a_bad_name_before_running_anything(workspace: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_bin(bin_dir, "npm", f"touch {tmp_path / 'ran'}")
    with pytest.raises(ToolFailure, match="invalid package name"):
        await _Executor(workspace, path=str(bin_dir)).install(["ok", "foo;rm -rf /"], "npm")
    assert not (tmp_path / "ran").exists()


# --- install: commands ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("manager", "argv"),
    [
        ("npm", ["npm", "install", "a", "b@1"]),
        ("bun", ["bun", "add", "a", "b@1"]),
        ("pip", ["python3", "-m", "pip", "install", "a", "b@1"]),
        ("pip3", ["python3", "-m", "pip", "install", "a", "b@1"]),
        ("apt", ["sudo", "-n", "apt-get", "install", "-y", "--", "a", "b@1"]),
        ("dnf", ["sudo", "-n", "dnf", "install", "-y", "a", "b@1"]),
    ],
)
def test_each_manager_gets_an_argument_list(manager: str, argv: list[str]) -> None:
    built, env = install_command(manager, ["a", "b@1"], {"PATH": "/bin"})
    assert built == argv
    assert env["PATH"] == "/bin"


def test_apt_runs_noninteractively() -> None:
    _, env = install_command("apt", ["curl"], {"PATH": "/bin"})
    assert env["DEBIAN_FRONTEND"] == "noninteractive"


@pytest.mark.parametrize(
    ("files", "npm_available", "expected"),
    [
        (["package.json"], False, "npm"),
        (["package.json", "bun.lockb"], True, "bun"),
        (["package.json", "bun.lock"], True, "bun"),
        (["requirements.txt"], True, "pip"),
        (["pyproject.toml"], True, "pip"),
        ([], True, "npm"),
        ([], False, "pip"),
    ],
)
def test_auto_picks_the_manager_from_the_project_files(
    workspace: Path, files: list[str], npm_available: bool, expected: str
) -> None:
    for name in files:
        (workspace / name).write_text("")
    assert choose_manager(workspace, npm_available) == expected


@pytest.mark.anyio
async def test_install_passes_names_as_arguments_not_through_a_shell(workspace: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_bin(bin_dir, "python3", 'printf "%s\\n" "$@"')
    executor = _Executor(workspace, path=f"{bin_dir}:/usr/bin:/bin")
    result = await executor.install(["requests>=2.31,<3", "foo[bar]"], "pip")
    assert result.exit_code == 0
    assert result.stdout == "-m\npip\ninstall\nrequests>=2.31,<3\nfoo[bar]\n"
    assert (
        sorted(path.name for path in workspace.iterdir()) == []
    )  # no file from a `>` redirect, no output directory (nothing saved)


@pytest.mark.anyio
async def test_auto_uses_npm_for_a_node_project(workspace: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_bin(bin_dir, "npm", 'echo "npm $*"')
    (workspace / "package.json").write_text("{}")
    result = await _Executor(workspace, path=f"{bin_dir}:/usr/bin:/bin").install(["lodash"], "auto")
    assert result.stdout == "npm install lodash\n"


@pytest.mark.anyio
async def test_missing_package_manager_is_reported(workspace: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(ToolFailure, match="^Error: bun is not installed$"):
        await _Executor(workspace, path=str(empty)).install(["lodash"], "bun")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("manager", "refusal"),
    [
        ("apt", "sudo: a password is required"),
        ("dnf", "Sorry, user agent is not allowed to execute '/usr/bin/dnf install -y curl' as root."),
        ("apt", "agent is not in the sudoers file."),
    ],
)
async def test_sudo_that_wants_a_password_gives_a_clear_message(
    workspace: Path, tmp_path: Path, manager: str, refusal: str
) -> None:
    bin_dir = tmp_path / "bin"
    fake_bin(bin_dir, "sudo", f'echo "{refusal}" >&2; exit 1')
    fake_bin(bin_dir, "apt-get", "exit 0")
    fake_bin(bin_dir, "dnf", "exit 0")
    with pytest.raises(ToolFailure, match="not allowed to run `sudo` without a password") as caught:
        await _Executor(workspace, path=f"{bin_dir}:/usr/bin:/bin").install(["curl"], manager)
    assert "administrator must grant" in str(caught.value)


@pytest.mark.anyio
async def test_missing_sudo_says_sudo_is_not_installed(workspace: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_bin(bin_dir, "apt-get", "exit 0")
    with pytest.raises(ToolFailure, match="sudo is not installed on this host"):
        await _Executor(workspace, path=str(bin_dir)).install(["curl"], "apt")


@pytest.mark.anyio
async def test_failing_install_returns_the_managers_output(workspace: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_bin(bin_dir, "npm", 'echo "npm ERR! 404 Not Found: $2" >&2; exit 1')
    result = await _Executor(workspace, path=f"{bin_dir}:/usr/bin:/bin").install(["no-such-pkg"], "npm")
    assert result.exit_code == 1
    assert result.stderr == "npm ERR! 404 Not Found: no-such-pkg\n"
