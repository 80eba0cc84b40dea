"""Why a running call was stopped, and by whom: what its finished audit record says of a cancelled call.

Whoever cancels a call (the console's Stop or Disconnect, a revocation, rotation or suspension, the client hanging
up, the server stopping) notes why on the call's `StopNote` before cancelling its scope; the call records the first
note it got. A call cancelled with no note was cancelled by its client through the SDK (`notifications/cancelled`,
or its session ended). A command that ran past its own timeout was stopped by no one: its record says so too.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

CONSOLE, REVOCATION, ROTATION, DISCONNECT, SHUTDOWN, CLIENT = (
    "console", "revocation", "rotation", "disconnect", "shutdown", "client",
)  # fmt: skip
SUSPENSION, SESSION_ENDED = "suspension", "session_ended"  # an admin suspended its credential, ended its MCP session
TIMEOUT = "timeout"  # the command ran past its own timeout (terminal_exec's `timeout`); nobody stopped it


@dataclass(frozen=True)
class Stopped:
    channel: str
    by: str = ""  # the staff user or operator, where one acted
    detail: str = ""  # a revocation's reason (bearer, token, client, refresh_reuse, ...)

    def sentence(self) -> str:
        by = f" by {self.by}" if self.by else ""
        if self.channel == CONSOLE:
            return f"stopped{by} from the console's Live view"
        if self.channel == ROTATION:
            return f"cancelled: all credentials were rotated{by}"
        if self.channel == REVOCATION:
            why = f" ({self.detail})" if self.detail else ""
            return f"cancelled: its credential was revoked{by}{why}"
        if self.channel == SUSPENSION:
            return f"cancelled: its credential was suspended{by}"
        if self.channel == SESSION_ENDED:
            return f"cancelled: its MCP session was disconnected{by} from the console"
        if self.channel == DISCONNECT:
            return "cancelled: the client hung up before the answer"
        if self.channel == SHUTDOWN:
            return "cancelled: the server was stopping"
        if self.channel == TIMEOUT:
            after = f" of {self.detail} s" if self.detail else ""
            return f"timed out: it ran past its timeout{after}, and its processes were killed"
        return "cancelled by the client (it cancelled the request or ended its session)"

    def as_detail(self) -> dict[str, str]:
        return {"channel": self.channel, "by": self.by, **({"detail": self.detail} if self.detail else {})}


BY_CLIENT = Stopped(CLIENT)


class StopNote:
    """The reason a call was stopped, once someone stopped it (the first reason given holds)."""

    def __init__(self) -> None:
        self.reason: Stopped | None = None

    def stop(self, scope: anyio.CancelScope, reason: Stopped) -> None:
        if self.reason is None:
            self.reason = reason
        scope.cancel()

    def why(self) -> Stopped:
        return self.reason or BY_CLIENT
