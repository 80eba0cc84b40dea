"""The in-process executor: the tools' OS work, done by the server's own process (a separate process later)."""

from __future__ import annotations

from collections.abc import Iterable

from mcpserver.executor.environment import clean_environment
from mcpserver.executor.files import FileOps
from mcpserver.executor.git import GitOps
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import ProcessOps
from mcpserver.executor.workspace import WorkspaceOps


class LocalExecutor(FileOps, ProcessOps, GitOps, WorkspaceOps):
    def __init__(self, root: str, env_allow: Iterable[str] = ()) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment(env_allow)
