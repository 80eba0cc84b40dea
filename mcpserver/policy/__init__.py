"""Command policy: rules that allow, ask about or deny a tool call before it runs (docs in each module)."""
