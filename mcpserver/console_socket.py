"""The console's live socket, /admin/live/socket: what agents are doing now (mcpserver.live) pushed to the console's
pages, and the actions they send back (approve, deny, stop a call, stop a background command).

Who may connect is who may use the console: the Origin must be the public URL's origin exactly (a page of any other
origin, or none, is refused before anything else), and the session must pass the console's own check
(`has_permission` of the admin site: active staff whose second factor is satisfied). The session is read again from
its store before every action and, at most every RECHECK_SECONDS, before a batch is forwarded: a sign-out, an
expired session or a revoked staff flag closes the socket (code 4403). An action also needs its model permission
(PERMISSIONS), so staff who may only view see everything and change nothing.

A page asks for what it shows: every console page gets the pending approvals (its cards); the Live page
(`?live=1`) also gets the running calls with their output and the background commands.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.routing import URLRouter
from django.conf import settings
from django.contrib import admin, auth
from django.contrib.sessions.backends.base import SessionBase
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, re_path, reverse
from django.utils import timezone
from django_otp.middleware import OTPMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from audit.log import Actor, aevent
from mcpserver.admin import UNKNOWN, job_states
from mcpserver.approvals.requests import CHANNEL_CONSOLE, DecisionRefused, describe
from mcpserver.approvals.waiting import decide_and_announce
from mcpserver.background import stop_jobs
from mcpserver.console_actions import PERMISSIONS, Action, ActionRefused, parse_action, ref_of
from mcpserver.executor.interface import ExecutorError
from mcpserver.live import GROUP, LIVE
from mcpserver.models import APPROVAL_PENDING, ApprovalRequest, BackgroundProcess
from mcpserver.process import INSTANCE_ID
from mcpserver.services import registered
from mcpserver.tools.jobs import state_text
from mcpserver.workers import ask_workers_to_stop, tell_workers
from oauth.authority import parse_authority
from oauth.credentials import KIND_BEARER, KIND_OAUTH
from oauth.return_to import RETURN_FIELD

logger = logging.getLogger(__name__)

SOCKET_PATH = "admin/live/socket"
CLOSE_REFUSED = 4403  # 4000-4999: the application's own codes; "403" for the page to read
RECHECK_SECONDS = 30.0
MAX_MESSAGE_CHARS = 16 * 1024  # the largest action is a denial with its reason, which JSON may write 6 times longer
LISTED = 50  # pending approvals and background commands a page is sent
COMMAND_CHARS = 2000
DEFAULT_DENY_REASON = "denied by an administrator"
UNKNOWN_TEXT = "unknown (the executor did not answer)"

Origin = tuple[str, str, int | None]  # scheme, host, port (the scheme's default when none is written)


# --- who may connect ---------------------------------------------------------------------------------------------


def parse_origin(value: str) -> Origin | None:
    """`scheme://host[:port]` and nothing more (no path, no user information), or None."""
    scheme, separator, netloc = value.partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in ("http", "https"):
        return None  # `null` included: an opaque origin is nobody we know
    authority = parse_authority(netloc)
    if authority is None:
        return None
    return scheme, authority.host, authority.effective_port(scheme)


def public_origin(public_url: str) -> Origin:
    parts = urlsplit(public_url)
    origin = parse_origin(f"{parts.scheme}://{parts.netloc}")
    if origin is None:
        raise ValueError(f"the public URL has no plain origin: {public_url!r}")
    return origin


def origin_allowed(values: list[str], public: Origin) -> bool:
    """Exactly one Origin header, naming the public URL's origin. A loopback origin counts only when it is the public
    URL's own (a development server): a page on another port of the same machine is another origin."""
    return len(values) == 1 and parse_origin(values[0]) == public


class ConsoleOriginCheck:
    """Refuse a WebSocket handshake from a page of another origin (cross-site WebSocket hijacking: the browser sends
    the session cookie along with any page's handshake, SameSite=Lax included)."""

    def __init__(self, app: ASGIApp, *, public_url: str) -> None:
        self.app = app
        self.public = public_origin(public_url)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origins = [value.decode("latin-1") for name, value in scope["headers"] if name == b"origin"]
        if scope["type"] == "websocket" and not origin_allowed(origins, self.public):
            logger.info("console socket refused: origin %r", origins[0][:200] if origins else None)
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": CLOSE_REFUSED})
            return
        await self.app(scope, receive, send)


def _no_response(request: HttpRequest) -> HttpResponse:
    return HttpResponse()


def console_user(session_key: str | None) -> Any | None:
    """The user of this session if the console would let them in now, else None.

    The session is loaded from its store (not the copy the handshake read) and goes through what an admin page's
    request goes through: Django's session user (its auth hash checked), django-otp's middleware (the second
    factor recorded in the session) and the admin site's `has_permission`: one definition of who may enter."""
    if not session_key:
        return None
    request = HttpRequest()
    session: SessionBase = importlib.import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    request.session = session
    request.user = auth.get_user(request)
    OTPMiddleware(_no_response)(request)  # installs request.user.is_verified(), as for every console request
    return request.user if admin.site.has_permission(request) else None


def scope_actor(user: Any, scope: Scope) -> Actor:
    """An admin acting through the console's socket, as audit.log.request_actor makes one from a request."""
    client = scope.get("client")
    agent = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"user-agent"), "")
    return Actor(
        user_id=user.pk,
        username=user.get_username(),
        credential_kind="session",
        client_address=str(client[0]) if client else "",
        user_agent=agent[:300],
    )


# --- what a page is sent -----------------------------------------------------------------------------------------


def revoke_url(credential_key: str) -> str:
    """The console's page that confirms revoking this credential ("bearer:<id>", "oauth:<app>:<user>"), or ""; it
    returns to the Live page once the credential is revoked (or kept)."""
    kind, _, rest = credential_key.partition(":")
    ident = rest.split(":", 1)[0]
    names = {KIND_BEARER: "admin:oauth_bearertoken_revoke", KIND_OAUTH: "admin:oauth_connectedapp_revoke"}
    if kind not in names or not ident.isdigit():
        return ""
    try:
        return f"{reverse(names[kind], args=[ident])}?{urlencode({RETURN_FIELD: reverse('admin:live')})}"
    except NoReverseMatch:
        return ""


def with_links(call: Mapping[str, Any], *, output: bool = True) -> dict[str, Any]:
    shown = {key: value for key, value in call.items() if output or key != "output"}
    call_id = call.get("call_id")
    recording = reverse("audit:recording_events", args=[call_id]) if call_id else ""
    page = reverse("audit:call_page", args=[call_id]) if call_id else ""
    return {
        **shown,
        "revoke_url": revoke_url(str(call.get("credential_key", ""))),
        "recording_url": recording,
        "page_url": page,
    }


def pending_approvals() -> list[dict[str, Any]]:
    """The pending requests that can still be decided, newest first."""
    pending = ApprovalRequest.objects.filter(state=APPROVAL_PENDING, expires_at__gt=timezone.now())
    return [describe(request) for request in pending.order_by("-id")[:LISTED]]


def background_commands() -> list[dict[str, Any]]:
    """The newest background commands, with the state the executor reports (one call for all of them)."""
    rows = list(BackgroundProcess.objects.order_by("-started_at", "-id")[:LISTED])
    return [
        {
            "id": row.pk,
            "pid": row.pid,
            "username": row.username,
            "credential": row.credential,
            "command": row.command[:COMMAND_CHARS],
            "cwd": row.cwd,
            "started_at": row.started_at.isoformat(),
            "state": state["state"],
            "state_text": UNKNOWN_TEXT if state["state"] == UNKNOWN["state"] else state_text(state),
            "size": state.get("size"),
        }
        for row, state in zip(rows, job_states(rows), strict=True)
    ]


# --- the consumer ------------------------------------------------------------------------------------------------


class ConsoleSocket(AsyncJsonWebsocketConsumer):
    user: Any = None
    checked_at = 0.0
    joined = False
    closing = False
    live_page = False  # the Live page: calls, output and background commands too, not only the approvals

    async def connect(self) -> None:
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        if not await self.still_allowed(on_connect=True):
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.live_page = query.get("live") == ["1"]
        if self.channel_layer is not None:
            # Joined before the snapshot is read: a change in between arrives after it (pages apply both).
            await self.channel_layer.group_add(GROUP, self.channel_name)
            self.joined = True
        await self.accept()
        await self.send_json({"type": "snapshot", **await self.snapshot()})
        if self.live_page and self.joined:
            # The calls running in the other workers reach this page as batches (mcpserver.workers).
            await tell_workers({"type": "workers.snapshot", "reply_to": self.channel_name, "from": INSTANCE_ID})

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
            self.joined = False

    async def still_allowed(self, on_connect: bool = False) -> bool:
        """Read the session again; close the socket (or refuse the handshake) if it may no longer use the console."""
        user = await database_sync_to_async(console_user)(self.session_key)
        if user is None:
            if not on_connect:
                logger.info("console socket closed: %s may no longer use the console", self.user)
            self.closing = True
            await self.close(code=CLOSE_REFUSED)
            return False
        self.user, self.checked_at = user, time.monotonic()
        return True

    async def snapshot(self) -> dict[str, Any]:
        snapshot: dict[str, Any] = {
            "server_time": timezone.now().isoformat(),  # the page's countdowns allow for its clock's offset
            "approvals": await database_sync_to_async(pending_approvals)(),
        }
        if self.live_page:
            snapshot["calls"] = [with_links(call) for call in LIVE.running()]
            snapshot["ended_calls"] = [with_links(call) for call in LIVE.recently_ended()]
            snapshot["background"] = await database_sync_to_async(background_commands)()
        return snapshot

    async def live_batch(self, message: dict[str, Any]) -> None:
        """A batch of changes from mcpserver.live, forwarded as far as this page shows them."""
        if self.closing:
            return
        page: dict[str, Any] = {"type": "batch", "approvals": message.get("approvals", [])}
        if self.live_page:
            # A batch's output is in `output`; the tail a call carries is for pages that open later (the snapshot).
            page["calls"] = [with_links(call, output=False) for call in message.get("calls", [])]
            page["output"] = message.get("output", {})
            page["output_units"] = message.get("output_units", {})
            page["ended"] = message.get("ended", {})
            page["seconds"] = message.get("seconds", {})
        background = self.live_page and bool(message.get("background"))
        if not background and not any(value for key, value in page.items() if key != "type"):
            return  # nothing this page shows
        if time.monotonic() - self.checked_at > RECHECK_SECONDS and not await self.still_allowed():
            return
        if background:
            page["background"] = await database_sync_to_async(background_commands)()
        await self.send_json(page)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self.closing:
            return
        content: object = None
        try:
            if text_data is None or len(text_data) > MAX_MESSAGE_CHARS:
                raise ActionRefused(f"an action is a JSON text of at most {MAX_MESSAGE_CHARS} characters")
            try:
                content = json.loads(text_data)
            except (json.JSONDecodeError, RecursionError):
                raise ActionRefused("an action is a JSON object") from None
            action = parse_action(content)
        except ActionRefused as refused:
            await self.result(False, str(refused), ref_of(content))
            return
        if not await self.still_allowed():
            return
        permission = PERMISSIONS[action.name]
        if not await database_sync_to_async(self.user.has_perm)(permission):
            await self.result(
                False, f"{self.user.get_username()} may not do that (permission {permission})", action.ref
            )
            return
        try:
            message = await self.act(action)
        except (ActionRefused, DecisionRefused) as refused:
            await self.result(False, str(refused), action.ref)
            return
        await self.result(True, message, action.ref)

    async def result(self, ok: bool, message: str, ref: str | int | None = None) -> None:
        await self.send_json({"type": "result", "ok": ok, "message": message, "ref": ref})

    async def act(self, action: Action) -> str:
        actor = scope_actor(self.user, self.scope)
        values = action.values
        if action.name == "approve":
            minutes = values["minutes"]
            decided = await decide_and_announce(values["id"], True, actor, CHANNEL_CONSOLE, "", minutes)
            grant = f"; this credential may run the same command shape for {minutes} minutes" if minutes else ""
            return f"R-{decided.request_id} approved{grant}"
        if action.name == "deny":
            reason = values["reason"] or DEFAULT_DENY_REASON
            decided = await decide_and_announce(values["id"], False, actor, CHANNEL_CONSOLE, reason)
            return f"R-{decided.request_id} denied"
        if action.name == "stop":
            return await self.stop_call(actor, values["call_id"])
        return await self.stop_background(actor, values["id"])

    async def stop_call(self, actor: Actor, call_id: str) -> str:
        call = LIVE.calls.get(call_id)
        if call is not None and LIVE.stop(call_id, actor.username):
            stopped = {"tool": call.tool, "summary": call.summary[:500], "username": call.username}
        else:  # running in another worker, if anywhere
            answer = await ask_workers_to_stop(call_id, actor.username)
            if answer is None:
                raise ActionRefused(f"no call {call_id} is running (it may have ended)")
            stopped = {key: str(answer.get(key, ""))[:500] for key in ("tool", "summary", "username")}
        await aevent(
            "console.call_stopped",
            actor,
            instance_id=INSTANCE_ID,
            call_id=call_id,
            tool=stopped["tool"],
            summary=stopped["summary"],
            user=stopped["username"],
        )
        return f"stopped {stopped['tool']} ({stopped['username']})"

    async def stop_background(self, actor: Actor, pk: int) -> str:
        row = await BackgroundProcess.objects.filter(pk=pk).afirst()
        if row is None:
            raise ActionRefused(f"there is no background command #{pk}")
        services = registered()
        if services is None:
            raise ActionRefused("the executor cannot be reached from this process")
        try:
            stopped = await stop_jobs(services.executor, [row])
        except ExecutorError as error:
            raise ActionRefused(f"nothing was stopped: the executor did not answer ({error})") from None
        if not stopped:
            raise ActionRefused(f"background command {row.pid} was not running")
        await aevent(
            "console.background_stopped",
            actor,
            instance_id=INSTANCE_ID,
            pids=[row.pid],
            commands=[row.command[:200]],
            users=[row.username],
        )
        LIVE.background_changed()
        return f"sent SIGTERM to background command {row.pid}"


class _Refuse:
    """Any other WebSocket path: refused, without the exception an unmatched URLRouter raises."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.close", "code": CLOSE_REFUSED})


def build_websocket_application(public_url: str) -> ASGIApp:
    """The "websocket" entry of the ASGI router: the Origin first, then the session and user, then the consumer."""
    # channels' URLRouter routes to ASGI applications; django-stubs types re_path() for Django views only.
    routes = [re_path(f"^{SOCKET_PATH}$", ConsoleSocket.as_asgi()), re_path(r"", _Refuse())]  # type: ignore[arg-type]
    app: ASGIApp = ConsoleOriginCheck(AuthMiddlewareStack(URLRouter(routes)), public_url=public_url)
    return app
