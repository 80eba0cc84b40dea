from django.apps import AppConfig


class McpServerConfig(AppConfig):
    name = "mcpserver"
    verbose_name = "MCP server"

    def ready(self) -> None:
        from mcpserver.revocations import on_credentials_revoked
        from mcpserver.session_views import count_open_sessions, sessions_url
        from oauth.revocation import credentials_revoked
        from oauth.session_links import register_session_links

        credentials_revoked.connect(on_credentials_revoked, dispatch_uid="mcpserver-revocations")
        register_session_links(count_open_sessions, sessions_url)  # "open sessions: N" on a credential's page
