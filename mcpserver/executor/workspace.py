"""workspace_info and workspace_install: a report on the host, and package installs without a shell."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from pathlib import Path

from mcpserver.executor.interface import ExecResult, ToolFailure
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import run_process
from mcpserver.executor.savedoutput import SavedOutput

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = 5.0
PROBE_BUDGET = 16 * 1024
INSTALL_TIMEOUT = 120.0
INSTALL_BUDGET = 128 * 1024
MAX_PACKAGES = 50
TOOLS = ("python3", "pip3", "node", "npm", "bun", "git", "make", "gcc", "curl", "docker")
MANAGERS = ("npm", "bun", "pip", "pip3", "dnf", "apt", "auto")
# The binary each manager needs, named in "Error: <manager> is not installed".
MANAGER_BINARIES = {"npm": "npm", "bun": "bun", "pip": "python3", "pip3": "python3", "apt": "apt-get", "dnf": "dnf"}
# Names and version specs (`@types/node@20`, `requests>=2.31,<3`, `foo[bar]`), nothing a shell or an option
# parser could take for more: no whitespace, quotes, `$;|&*?()` or backticks, and no leading `-`.
PACKAGE_NAME = re.compile(r"[A-Za-z0-9@][A-Za-z0-9._+\-@/=<>!~^,:\[\]]*")
GIT_ROOTS_DEPTH = 4  # levels below the workspace searched for repositories
GIT_ROOTS_VISITS = 5000  # directories looked into at most: the policy needs an answer, not a census
SUDO_REFUSALS = (
    "password is required",
    "a terminal is required",
    "not allowed",
    "not in the sudoers",
    "may not run sudo",
)


def find_git_roots(root: str, depth: int, visits: int) -> list[str]:
    found: list[str] = []
    level = [root]
    for _ in range(depth + 1):
        below: list[str] = []
        for directory in level:
            visits -= 1
            if visits < 0:
                return found
            try:
                with os.scandir(directory) as entries:
                    children = [e for e in entries if e.is_dir(follow_symlinks=False) or e.name == ".git"]
            except OSError:
                continue
            if any(child.name == ".git" for child in children):
                found.append(directory)
                continue
            below += [child.path for child in children if child.is_dir(follow_symlinks=False)]
        level = below
    return found


def validate_packages(packages: list[str]) -> None:
    if not packages:
        raise ToolFailure("Error: no packages given")
    if len(packages) > MAX_PACKAGES:
        raise ToolFailure(f"Error: at most {MAX_PACKAGES} packages per call ({len(packages)} given)")
    for name in packages:
        if not PACKAGE_NAME.fullmatch(name):
            raise ToolFailure(
                f"Error: invalid package name {name!r}: use letters, digits and ._+-@/=<>!~^,:[] only, "
                "not starting with '-'"
            )


def choose_manager(root: Path, npm_available: bool) -> str:
    """The manager `auto` means for this workspace: its project files decide, else whatever is installed."""
    if (root / "package.json").exists():
        return "bun" if (root / "bun.lockb").exists() or (root / "bun.lock").exists() else "npm"
    if (root / "requirements.txt").exists() or (root / "pyproject.toml").exists():
        return "pip"
    return "npm" if npm_available else "pip"


def install_command(manager: str, packages: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argument list and environment that install `packages` with `manager` (never a shell)."""
    commands = {
        "npm": ["npm", "install", *packages],
        "bun": ["bun", "add", *packages],
        "pip": ["python3", "-m", "pip", "install", *packages],
        "pip3": ["python3", "-m", "pip", "install", *packages],
        "apt": ["sudo", "-n", "apt-get", "install", "-y", "--", *packages],
        "dnf": ["sudo", "-n", "dnf", "install", "-y", *packages],
    }
    if manager == "apt":
        return commands[manager], {**env, "DEBIAN_FRONTEND": "noninteractive"}
    return commands[manager], dict(env)


def _sudo_refused(manager: str) -> ToolFailure:
    return ToolFailure(
        f"Error: installing with {manager} needs root, and the agent's OS user is not allowed to run `sudo` "
        "without a password. An administrator must grant it passwordless sudo for the package manager "
        "(a sudoers rule), or install the packages themselves."
    )


def _os_name() -> str:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip().strip('"')
    return "unknown"


class WorkspaceOps:
    """The executor's workspace tools. Expects `self.workspace`, `self.root` and `self.env` (see LocalExecutor)."""

    workspace: Workspace
    root: str
    env: dict[str, str]
    saved_output: SavedOutput

    async def git_roots(self) -> list[str]:
        """The git repositories in the workspace (the directories holding a `.git`), for the command policy's
        "outside the workspace's repositories" (mcpserver/policy). Links are not followed; a repository's own
        subdirectories are not searched."""
        return await asyncio.to_thread(find_git_roots, self.root, GIT_ROOTS_DEPTH, GIT_ROOTS_VISITS)

    async def _probe(self, argv: list[str]) -> str:
        """A short command's output, or `not installed` / `(timed out)`; never a shell, never long."""
        # The outputs are far below the budget, so nothing is spilled and the output directory is not created: a
        # report must work in a read-only workspace.
        try:
            result = await run_process(
                argv,
                cwd=self.root,
                env=self.env,
                timeout=PROBE_TIMEOUT,
                output_budget=PROBE_BUDGET,
                listener=None,
                saved=self.saved_output,
                label="info",
            )
        except ToolFailure:
            return "not installed"
        if result.timed_out:
            return "(timed out)"
        return (result.stdout or result.stderr).strip("\n") or f"(exit code {result.exit_code})"

    def _tools(self) -> str:
        path = self.env.get("PATH")
        return "\n".join(f"{name}: {shutil.which(name, path=path) or 'not found'}" for name in TOOLS)

    async def workspace_info(self) -> str:
        probes = (
            ["uname", "-srm"],
            ["node", "--version"],
            ["npm", "--version"],
            ["git", "--version"],
            ["df", "-h", "--", self.root],
            ["free", "-h"],
        )
        uname, node, npm, git, disk, memory = await asyncio.gather(*(self._probe(argv) for argv in probes))
        node_text = "not installed" if node == "not installed" else f"node {node}\nnpm {npm}"
        sections = [
            ("OS", f"{_os_name()}\n{uname}"),
            ("Node", node_text),
            ("Git", git),
            ("Disk", disk),
            ("CWD", self.root),
            ("Tools", self._tools()),
            ("Memory", memory),
        ]
        return "\n".join(f"=== {title} ===\n{content}\n" for title, content in sections)

    async def install(self, packages: list[str], manager: str) -> ExecResult:
        manager = manager or "auto"
        if manager not in MANAGERS:
            raise ToolFailure(f"Error: unknown package manager {manager!r} (use one of {', '.join(MANAGERS)})")
        validate_packages(packages)
        path = self.env.get("PATH")
        if manager == "auto":
            manager = choose_manager(self.workspace.root, shutil.which("npm", path=path) is not None)
        argv, env = install_command(manager, packages, self.env)
        if manager in ("apt", "dnf") and shutil.which("sudo", path=path) is None:
            raise ToolFailure(
                f"Error: installing with {manager} needs root through `sudo -n`, and sudo is not installed on this "
                "host. An administrator must install sudo and grant the agent's user a rule for the package manager, "
                "or install the packages themselves."
            )
        if shutil.which(MANAGER_BINARIES[manager], path=path) is None:
            raise ToolFailure(f"Error: {manager} is not installed")
        result = await run_process(
            argv,
            cwd=self.root,
            env=env,
            timeout=INSTALL_TIMEOUT,
            output_budget=INSTALL_BUDGET,
            listener=None,
            saved=self.saved_output,
            label="install",
        )
        refused = any(phrase in result.stderr for phrase in SUDO_REFUSALS)
        if manager in ("apt", "dnf") and result.exit_code != 0 and refused:
            raise _sudo_refused(manager)
        return result
