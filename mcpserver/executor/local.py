"""The tools' OS work, done in the process that holds it: the executor process (see service.py) or a test."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from mcpserver.executor import credential_groups
from mcpserver.executor.editing import EditOps
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.files import FileOps
from mcpserver.executor.git import GitOps
from mcpserver.executor.images import ImageOps
from mcpserver.executor.interface import Executor
from mcpserver.executor.jobs import JobOps
from mcpserver.executor.patching import PatchOps
from mcpserver.executor.paths import Workspace
from mcpserver.executor.processes import ProcessOps
from mcpserver.executor.savedoutput import DEFAULT_MAX_BYTES, SavedOutput
from mcpserver.executor.search import SearchOps
from mcpserver.executor.workspace import WorkspaceOps


class LocalExecutor(
    FileOps, EditOps, PatchOps, ProcessOps, GitOps, WorkspaceOps, ImageOps, SearchOps, JobOps, Executor
):
    def __init__(
        self,
        root: str,
        env_allow: Iterable[str] = (),
        output_max_bytes: int = DEFAULT_MAX_BYTES,
        output_dir: str | None = None,
    ) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment(env_allow)
        # None: beside the workspace (tests, the benchmark); the executor process is always given its own.
        self.saved_output = SavedOutput(self.workspace, output_max_bytes, directory=output_dir)
        self._input_locks: dict[str, asyncio.Lock] = {}

    async def end_credentials(self, keys: list[str], prefixes: list[str], before: float) -> list[dict[str, Any]]:
        return await credential_groups.active().end(keys, prefixes, before)

    async def prune_output(self, max_bytes: int | None = None) -> str:
        """Maintenance (not a tool): delete saved command output past its age, then the oldest past `max_bytes`
        (default: the budget)."""
        directory = self.saved_output.directory
        if not directory.is_dir():
            return f"Nothing to prune: {directory} does not exist."
        removed, files, left = self.saved_output.prune(max_bytes)
        budget = self.saved_output.max_bytes
        of_budget = f" of its budget of {budget}" if budget else " (no budget)"
        return f"Pruned {directory}: {removed} of {files} files removed; {left} bytes left{of_budget}."
