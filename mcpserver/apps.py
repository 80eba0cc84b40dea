from django.apps import AppConfig


class McpServerConfig(AppConfig):
    name = "mcpserver"
    verbose_name = "MCP server"

    def ready(self) -> None:
        from mcpserver.revocations import on_credentials_revoked
        from oauth.revocation import credentials_revoked

        credentials_revoked.connect(on_credentials_revoked, dispatch_uid="mcpserver-revocations")
