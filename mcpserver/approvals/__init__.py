"""Human approval of tool calls a policy rule asks about."""
