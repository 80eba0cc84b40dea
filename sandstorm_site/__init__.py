"""Sandstorm: a self-hosted MCP server with tokens, OAuth and an audit log."""
