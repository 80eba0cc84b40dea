"""The tools: the 20 of the reference server first, then the agent toolkit's. Importing this package registers
them all in mcpserver.registry.TOOLS, in the order tools/list shows."""

from mcpserver.tools import files, terminal, git, workspace, edits, search, jobs, patch  # isort: skip  (the order tools/list shows)

ALL_TOOL_MODULES = (files, terminal, git, workspace, edits, search, jobs, patch)
