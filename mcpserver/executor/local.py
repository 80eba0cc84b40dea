"""The tools' OS work, done in the process that holds it: the executor process (see service.py) or a test."""

from __future__ import annotations

from collections.abc import Iterable

from mcpserver.executor.capture import prune_output_dir
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.files import FileOps
from mcpserver.executor.git import GitOps
from mcpserver.executor.paths import OUTPUT_SUBDIR, SANDSTORM_DIR, Workspace
from mcpserver.executor.processes import ProcessOps
from mcpserver.executor.workspace import WorkspaceOps


class LocalExecutor(FileOps, ProcessOps, GitOps, WorkspaceOps):
    def __init__(self, root: str, env_allow: Iterable[str] = ()) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment(env_allow)

    async def prune_output(self) -> str:
        """Maintenance (not a tool): delete saved command output past its age and size limits."""
        directory = self.workspace.root / SANDSTORM_DIR / OUTPUT_SUBDIR
        if not directory.is_dir():
            return f"Nothing to prune: {directory} does not exist."
        before = [path for path in directory.iterdir() if path.is_file()]
        prune_output_dir(directory)
        removed = sum(1 for path in before if not path.exists())
        return f"Pruned {directory}: {removed} of {len(before)} files removed."
