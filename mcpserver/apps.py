from django.apps import AppConfig


class McpServerConfig(AppConfig):
    name = "mcpserver"
    verbose_name = "MCP server"
