"""The 20 tools. Importing this package registers them all in mcpserver.registry.TOOLS."""

from mcpserver.tools import files, terminal, git, workspace  # isort: skip  (the order tools/list shows)

ALL_TOOL_MODULES = (files, terminal, git, workspace)
