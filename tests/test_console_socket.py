"""The console's live socket (mcpserver/console_socket.py), driven in this process with Channels' communicator: who
may connect (the exact Origin, the console's own session check), the snapshot, batches forwarded, the session read
again, and every action with good and bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.models import AuditRecord
from mcpserver import console_socket
from mcpserver.approvals.requests import arguments_digest
from mcpserver.console_socket import (
    CLOSE_REFUSED,
    build_websocket_application,
    origin_allowed,
    parse_origin,
    public_origin,
    revoke_url,
)
from mcpserver.live import GROUP, LIVE, LiveCall
from mcpserver.models import APPROVAL_APPROVED, APPROVAL_DENIED, ApprovalGrant, ApprovalRequest, BackgroundProcess

PUBLIC_URL = "https://console.example"
ORIGIN = b"https://console.example"
PATH = "/admin/live/socket"
BACK_TO_LIVE = "?next=%2Fadmin%2Flive%2F"  # the confirmation returns to the Live page

pytestmark = [pytest.mark.anyio]
db = pytest.mark.django_db(transaction=True)


# --- the Origin, exactly -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("public_url", "origin"),
    [
        ("https://console.example", "https://console.example"),
        ("https://console.example", "https://console.example:443"),
        ("https://console.example", "HTTPS://Console.Example"),
        ("https://console.example:8443/", "https://console.example:8443"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ],
)
def test_the_public_urls_own_origin_is_allowed(public_url: str, origin: str) -> None:
    assert origin_allowed([origin], public_origin(public_url))


@pytest.mark.parametrize(
    ("public_url", "origins"),
    [
        ("https://console.example", []),
        ("https://console.example", ["https://console.example", "https://console.example"]),
        ("https://console.example", ["http://console.example"]),
        ("https://console.example", ["https://console.example:8443"]),
        ("https://console.example", ["https://evil.example"]),
        ("https://console.example", ["https://console.example.evil.example"]),
        ("https://console.example", ["https://user@console.example"]),
        ("https://console.example", ["https://console.example/admin"]),
        ("https://console.example", ["null"]),
        ("https://console.example", ["console.example"]),
        ("https://console.example", ["http://127.0.0.1:8080"]),
        ("https://console.example", ["http://localhost"]),
        # A loopback origin only when it is the public URL's own: another port or spelling is another origin.
        ("http://127.0.0.1:8080", ["http://127.0.0.1:8081"]),
        ("http://127.0.0.1:8080", ["http://localhost:8080"]),
        ("http://127.0.0.1:8080", ["http://[::1]:8080"]),
        ("http://127.0.0.1:8080", ["https://127.0.0.1:8080"]),
    ],
)
def test_any_other_origin_or_none_is_refused(public_url: str, origins: list[str]) -> None:
    assert not origin_allowed(origins, public_origin(public_url))


def test_an_origin_is_read_strictly() -> None:
    assert parse_origin("https://console.example") == ("https", "console.example", 443)
    assert parse_origin("http://console.example:8080") == ("http", "console.example", 8080)
    for bad in ("ws://console.example", "https://", "https://console.example:99999", "https://127.1", ""):
        assert parse_origin(bad) is None
    with pytest.raises(ValueError):
        public_origin("https://user@console.example/")


def test_a_credential_links_to_its_revoke_confirmation_which_returns_to_live() -> None:
    assert revoke_url("bearer:12") == f"/admin/oauth/bearertoken/12/revoke/{BACK_TO_LIVE}"
    assert revoke_url("oauth:3:7") == f"/admin/oauth/connectedapp/3/revoke/{BACK_TO_LIVE}"
    assert revoke_url("bearer:x") == revoke_url("session:") == revoke_url("") == ""


# --- fixtures --------------------------------------------------------------------------------------------------------


@pytest.fixture
def app() -> Any:
    return build_websocket_application(PUBLIC_URL)


def make_user(username: str, *, staff: bool = True, active: bool = True, superuser: bool | None = None) -> User:
    return get_user_model().objects.create_user(
        username,
        password="a password that is long",
        is_staff=staff,
        is_superuser=staff if superuser is None else superuser,
        is_active=active,
    )


def session_of(user: User, *, verified_with: TOTPDevice | None = None) -> str:
    """A signed-in session's key, as the browser's cookie holds it (with the second factor given, if a device)."""
    client = Client()
    client.force_login(user)
    session = client.session
    if verified_with is not None:
        session[DEVICE_ID_SESSION_KEY] = verified_with.persistent_id
        session.save()
    return str(session.session_key)


def headers(session_key: str | None = None, origin: bytes | None = ORIGIN) -> list[tuple[bytes, bytes]]:
    found = [(b"user-agent", b"pytest console")]
    if origin is not None:
        found.append((b"origin", origin))
    if session_key is not None:
        found.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session_key}".encode()))
    return found


def pending_request(**fields: Any) -> ApprovalRequest:
    arguments = {"command": "git push --force origin main"}
    values: dict[str, Any] = {
        "expires_at": timezone.now() + timedelta(minutes=5),
        "call_id": "c" * 32,
        "instance_id": "i" * 32,
        "tool": "terminal_exec",
        "arguments": arguments,
        "arguments_sha256": arguments_digest(arguments),
        "shape": "git push --force *",
        "cwd": "/work/repo",
        "username": "agent",
        "credential_key": "bearer:5",
        "credential_kind": "bearer",
        "credential_id": "5",
        "credential_name": "laptop",
        "client_address": "203.0.113.9",
        "rule_id": "force-push",
        "rule_reason": "force pushes rewrite history",
        **fields,
    }
    return ApprovalRequest.objects.create(**values)


@pytest.fixture
def staff(transactional_db: None) -> User:
    return make_user("boss")


@pytest.fixture
def staff_session(staff: User) -> str:
    return session_of(staff)


@pytest.fixture
def no_live_calls() -> Iterator[None]:
    before = dict(LIVE.calls)
    LIVE.calls.clear()
    yield
    LIVE.calls.clear()
    LIVE.calls.update(before)


async def connected(app: Any, session_key: str, path: str = PATH) -> tuple[WebsocketCommunicator, dict[str, Any]]:
    communicator = WebsocketCommunicator(app, path, headers=headers(session_key))
    ok, code = await communicator.connect(timeout=5)
    assert ok, f"refused with {code}"
    snapshot = await communicator.receive_json_from(timeout=5)
    assert snapshot["type"] == "snapshot"
    return communicator, snapshot


@pytest.fixture
async def page(app: Any, staff_session: str, no_live_calls: None) -> AsyncIterator[WebsocketCommunicator]:
    """A console page's socket (the approval cards), connected as staff."""
    communicator, _ = await connected(app, staff_session)
    yield communicator
    await communicator.disconnect()


async def refused(app: Any, header_list: list[tuple[bytes, bytes]], path: str = PATH) -> Any:
    communicator = WebsocketCommunicator(app, path, headers=header_list)
    ok, code = await communicator.connect(timeout=5)
    await communicator.disconnect(timeout=5)  # what the server tells the consumer after refusing the handshake
    return (ok, code)


async def act(page: WebsocketCommunicator, action: Any) -> dict[str, Any]:
    await page.send_to(text_data=action if isinstance(action, str) else json.dumps(action))
    answer: dict[str, Any] = await page.receive_json_from(timeout=5)
    assert answer["type"] == "result", answer
    return answer


# --- connecting ------------------------------------------------------------------------------------------------------


@db
async def test_a_staff_session_connects_and_gets_the_pending_approvals(app: Any, staff_session: str) -> None:
    first = await sync_to_async(pending_request)()
    newer = await sync_to_async(pending_request)(tool="file_write", arguments={"path": "a.txt", "content": "x"})
    await sync_to_async(pending_request)(state=APPROVAL_DENIED)
    await sync_to_async(pending_request)(expires_at=timezone.now() - timedelta(seconds=1))
    communicator, snapshot = await connected(app, staff_session)
    await communicator.disconnect()
    assert [approval["label"] for approval in snapshot["approvals"]] == [newer.label, first.label]
    card = snapshot["approvals"][1]
    assert card["summary"] == "git push --force origin main" and card["rule_id"] == "force-push"
    assert card["username"] == "agent" and card["credential_name"] == "laptop" and card["address"] == "203.0.113.9"
    assert snapshot["approvals"][0]["summary"] == '{"content": "x", "path": "a.txt"}'
    assert "calls" not in snapshot and "background" not in snapshot  # a page with cards only


@db
async def test_the_live_page_also_gets_the_running_calls_and_background_commands(
    app: Any, staff_session: str, no_live_calls: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mcpserver.services._registered", None)  # not the executor of an earlier test's server
    await sync_to_async(BackgroundProcess.objects.create)(
        pid=4242, pgid=4242, start_ticks=1, command="sleep 300", log_path="/tmp/x.log", credential="bearer:5",
        username="agent", instance_id="i" * 32,
    )  # fmt: skip
    LIVE.calls["a" * 32] = LiveCall("a" * 32, "terminal_exec", "make test", "agent", "laptop", "bearer:5", "::1")
    communicator, snapshot = await connected(app, staff_session, f"{PATH}?live=1")
    await communicator.disconnect()
    [call] = snapshot["calls"]
    assert call["summary"] == "make test" and call["revoke_url"] == f"/admin/oauth/bearertoken/5/revoke/{BACK_TO_LIVE}"
    [job] = snapshot["background"]
    assert job["pid"] == 4242 and job["command"] == "sleep 300"
    assert job["state"] == "unknown"  # no executor in this process


@db
async def test_an_anonymous_socket_is_refused(app: Any) -> None:
    assert await refused(app, headers()) == (False, CLOSE_REFUSED)
    assert await refused(app, headers("not-a-session-key")) == (False, CLOSE_REFUSED)


@db
async def test_a_user_who_may_not_use_the_console_is_refused(app: Any) -> None:
    visitor = await sync_to_async(make_user)("visitor", staff=False)
    assert await refused(app, headers(await sync_to_async(session_of)(visitor))) == (False, CLOSE_REFUSED)
    retired = await sync_to_async(make_user)("retired")
    key = await sync_to_async(session_of)(retired)
    await User.objects.filter(pk=retired.pk).aupdate(is_active=False)
    assert await refused(app, headers(key)) == (False, CLOSE_REFUSED)


@db
async def test_staff_without_the_second_factor_they_owe_are_refused(app: Any, settings: Any) -> None:
    enrolled = await sync_to_async(make_user)("enrolled")
    device = await TOTPDevice.objects.acreate(user=enrolled, name="app", confirmed=True)
    assert await refused(app, headers(await sync_to_async(session_of)(enrolled))) == (False, CLOSE_REFUSED)
    communicator, _ = await connected(app, await sync_to_async(session_of)(enrolled, verified_with=device))
    await communicator.disconnect()

    settings.REQUIRE_SECOND_FACTOR = True
    unenrolled = await sync_to_async(make_user)("unenrolled")
    assert await refused(app, headers(await sync_to_async(session_of)(unenrolled))) == (False, CLOSE_REFUSED)


@db
async def test_a_foreign_or_missing_origin_is_refused_even_with_a_staff_session(app: Any, staff_session: str) -> None:
    for origin in (b"https://evil.example", b"null", b"http://console.example", None):
        assert await refused(app, headers(staff_session, origin)) == (False, CLOSE_REFUSED), origin
    both = [*headers(staff_session), (b"origin", b"https://evil.example")]
    assert await refused(app, both) == (False, CLOSE_REFUSED)


@db
async def test_another_socket_path_is_refused(app: Any, staff_session: str) -> None:
    assert await refused(app, headers(staff_session), "/admin/live/other") == (False, CLOSE_REFUSED)


# --- what is forwarded -----------------------------------------------------------------------------------------------


def batch(**fields: Any) -> dict[str, Any]:
    return {
        "type": "live.batch",
        "calls": [],
        "output": {},
        "ended": {},
        "approvals": [],
        "background": False,
        **fields,
    }


@db
async def test_a_batch_sent_to_the_group_reaches_the_page(page: WebsocketCommunicator) -> None:
    approval = {"id": 9, "label": "R-9", "state": "pending"}
    await get_channel_layer().group_send(GROUP, batch(approvals=[approval], output={"x": "hidden"}))
    got = await page.receive_json_from(timeout=5)
    assert got == {"type": "batch", "approvals": [approval]}  # a page with cards only gets the approvals


@db
async def test_the_live_page_gets_calls_output_and_ends(app: Any, staff_session: str, no_live_calls: None) -> None:
    communicator, _ = await connected(app, staff_session, f"{PATH}?live=1")
    call = {"call_id": "b" * 32, "tool": "terminal_exec", "credential_key": "oauth:3:7", "summary": "ls"}
    await get_channel_layer().group_send(
        GROUP,
        batch(
            calls=[{**call, "output": "line 1\n"}],
            output={"b" * 32: "line 1\n"},
            output_units={"b" * 32: 7},
            ended={"d" * 32: "ok"},
            seconds={"d" * 32: 1.5},
        ),
    )
    got = await communicator.receive_json_from(timeout=5)
    await communicator.disconnect()
    # The output once, in `output`: the tail a call carries is for the snapshot of a page that opens later.
    recording = f"/admin/audit/calls/{'b' * 32}/recording.json"  # where a page picks the whole output up
    page = f"/admin/audit/calls/{'b' * 32}/"  # the call's page, which replays all of it
    assert got["calls"] == [
        {
            **call,
            "revoke_url": f"/admin/oauth/connectedapp/3/revoke/{BACK_TO_LIVE}",
            "recording_url": recording,
            "page_url": page,
        }
    ]
    assert got["output"] == {"b" * 32: "line 1\n"} and got["ended"] == {"d" * 32: "ok"}
    assert got["output_units"] == {"b" * 32: 7} and got["seconds"] == {"d" * 32: 1.5}


@db
async def test_a_batch_with_nothing_for_the_page_is_not_sent(page: WebsocketCommunicator) -> None:
    await get_channel_layer().group_send(GROUP, batch(output={"x": "only for the Live page"}))
    assert await page.receive_nothing(timeout=0.3)


# --- the session read again ------------------------------------------------------------------------------------------


@db
async def test_a_revoked_staff_flag_closes_the_socket_at_the_next_action(page: WebsocketCommunicator) -> None:
    await User.objects.filter(username="boss").aupdate(is_staff=False)
    await page.send_json_to({"action": "stop", "call_id": "e" * 32})
    assert await page.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_REFUSED}


@db
async def test_a_signed_out_session_closes_the_socket_at_the_next_batch(
    page: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_socket, "RECHECK_SECONDS", 0.0)
    await Session.objects.all().adelete()  # what signing out does to the session
    await get_channel_layer().group_send(GROUP, batch(approvals=[{"id": 1, "label": "R-1", "state": "pending"}]))
    assert await page.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_REFUSED}


@db
async def test_batches_do_not_read_the_session_more_often_than_the_recheck_interval(
    page: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[str | None] = []
    real = console_socket.console_user

    def counted(session_key: str | None) -> Any:
        checks.append(session_key)
        return real(session_key)

    monkeypatch.setattr(console_socket, "console_user", counted)
    for number in range(3):
        await get_channel_layer().group_send(GROUP, batch(approvals=[{"id": number, "state": "pending"}]))
        await page.receive_json_from(timeout=5)
    assert checks == []


# --- actions ---------------------------------------------------------------------------------------------------------


@db
@pytest.mark.parametrize(
    ("action", "says"),
    [
        ("not json", "an action is a JSON object"),
        ("[1, 2]", "an action is a JSON object"),
        ("[" * 20000, "at most"),
        ("[" * 5000, "an action is a JSON object"),
        ("[" * 8000 + "]" * 8000, "an action is a JSON object"),  # deeper than the parser goes
        ({"action": "explode"}, "unknown action"),
        ({"id": 1}, "unknown action"),
        ({"action": "approve"}, "id: a positive whole number"),
        ({"action": "approve", "id": "1"}, "id: a positive whole number"),
        ({"action": "approve", "id": True}, "id: a positive whole number"),
        ({"action": "approve", "id": -4}, "id: a positive whole number"),
        ({"action": "approve", "id": 1.5}, "id: a positive whole number"),
        ({"action": "approve", "id": 2**70}, "id: a positive whole number"),
        ({"action": "approve", "id": 1, "minutes": 0}, "minutes: a whole number from 1 to 1440"),
        ({"action": "approve", "id": 1, "minutes": 1441}, "minutes: a whole number from 1 to 1440"),
        ({"action": "approve", "id": 1, "minutes": "10"}, "minutes: a whole number from 1 to 1440"),
        ({"action": "approve", "id": 1, "minutes": 10.0}, "minutes: a whole number from 1 to 1440"),
        ({"action": "approve", "id": 1, "as": "root"}, "unknown field: as"),
        ({"action": "deny", "id": 1, "reason": 5}, "reason: text of at most 2000 characters"),
        ({"action": "deny", "id": 1, "reason": "x" * 2001}, "reason: text of at most 2000 characters"),
        ({"action": "stop"}, "call_id: a call id is needed"),
        ({"action": "stop", "call_id": "../../etc"}, "call_id: a call id is needed"),
        ({"action": "stop", "call_id": "a" * 65}, "call_id: a call id is needed"),
        ({"action": "stop_background", "id": None}, "id: a positive whole number"),
        ({"action": "stop", "call_id": "a", "ref": "r" * 41}, "ref:"),
    ],
)
async def test_an_action_with_bad_input_is_refused(page: WebsocketCommunicator, action: Any, says: str) -> None:
    answer = await act(page, action)
    assert answer["ok"] is False and says in answer["message"], answer


@db
async def test_a_binary_frame_is_refused(page: WebsocketCommunicator) -> None:
    await page.send_to(bytes_data=b'{"action": "stop", "call_id": "a"}')
    answer = await page.receive_json_from(timeout=5)
    assert answer["ok"] is False and "JSON text" in answer["message"]


@db
async def test_a_result_carries_the_actions_ref(page: WebsocketCommunicator) -> None:
    answer = await act(page, {"action": "approve", "id": "x", "ref": 7})
    assert answer["ref"] == 7 and answer["ok"] is False


@db
async def test_approving_for_some_minutes_decides_the_request_and_records_who(page: WebsocketCommunicator) -> None:
    request = await sync_to_async(pending_request)()
    answer = await act(page, {"action": "approve", "id": request.pk, "minutes": 15, "ref": "card-1"})
    assert answer == {
        "type": "result",
        "ok": True,
        "message": f"{request.label} approved; this credential may run the same command shape for 15 minutes",
        "ref": "card-1",
    }
    await request.arefresh_from_db()
    assert (request.state, request.decided_by, request.channel) == (APPROVAL_APPROVED, "boss", "console")
    grant = await ApprovalGrant.objects.aget(request=request)
    assert grant.granted_by == "boss" and grant.credential_key == "bearer:5"
    decided = await AuditRecord.objects.aget(event="approval.decided")
    assert decided.username == "boss" and decided.credential_kind == "session"
    assert decided.user_agent == "pytest console"
    assert isinstance(decided.detail, dict)
    assert decided.detail["request"] == request.label and decided.detail["channel"] == "console"
    update = await page.receive_json_from(timeout=5)  # the decision, as every page sees it
    assert update["approvals"][0]["state"] == APPROVAL_APPROVED


@db
async def test_a_denial_without_a_reason_gets_the_default_one(page: WebsocketCommunicator) -> None:
    request = await sync_to_async(pending_request)()
    answer = await act(page, {"action": "deny", "id": request.pk, "reason": "   "})
    assert answer["ok"] is True and answer["message"] == f"{request.label} denied"
    await request.arefresh_from_db()
    assert request.state == APPROVAL_DENIED and request.reason == "denied by an administrator"


@db
async def test_denying_a_request_someone_decided_first_says_who(page: WebsocketCommunicator) -> None:
    request = await sync_to_async(pending_request)(
        state=APPROVAL_APPROVED, decided_by="alice", channel="elicitation", decided_at=timezone.now()
    )
    answer = await act(page, {"action": "deny", "id": request.pk, "reason": "no"})
    assert answer["ok"] is False
    assert answer["message"] == f"{request.label} was already decided: approved by alice (elicitation)"
    answer = await act(page, {"action": "approve", "id": 987654})
    assert answer == {"type": "result", "ok": False, "message": "there is no request R-987654", "ref": None}


@db
async def test_staff_who_may_only_view_can_neither_decide_nor_stop(app: Any) -> None:
    viewer = await sync_to_async(make_user)("viewer", superuser=False)
    await viewer.user_permissions.aset([perm async for perm in Permission.objects.filter(codename__startswith="view_")])
    request = await sync_to_async(pending_request)()
    communicator, snapshot = await connected(app, await sync_to_async(session_of)(viewer))
    assert [approval["id"] for approval in snapshot["approvals"]] == [request.pk]  # viewing is theirs
    for action, permission in [
        ({"action": "approve", "id": request.pk}, "mcpserver.change_approvalrequest"),
        ({"action": "deny", "id": request.pk}, "mcpserver.change_approvalrequest"),
        ({"action": "stop", "call_id": "a" * 32}, "mcpserver.change_backgroundprocess"),
        ({"action": "stop_background", "id": 1}, "mcpserver.change_backgroundprocess"),
    ]:
        answer = await act(communicator, action)
        assert answer["ok"] is False and answer["message"] == f"viewer may not do that (permission {permission})"
    await communicator.disconnect()
    await request.arefresh_from_db()
    assert request.state == "pending"


@db
async def test_stopping_a_call_that_is_not_running_says_so(page: WebsocketCommunicator) -> None:
    answer = await act(page, {"action": "stop", "call_id": "f" * 32})
    assert answer["ok"] is False
    assert answer["message"] == f"no call {'f' * 32} is running (it may have ended)"


@db
async def test_stopping_a_running_call_cancels_it_and_records_who(page: WebsocketCommunicator) -> None:
    scope = anyio.CancelScope()
    LIVE.calls["a" * 32] = LiveCall(
        "a" * 32, "terminal_exec", "sleep 100", "agent", "laptop", "bearer:5", "::1", scope=scope
    )
    answer = await act(page, {"action": "stop", "call_id": "a" * 32})
    assert answer["ok"] is True and answer["message"] == "stopped terminal_exec (agent)"
    assert scope.cancel_called
    stopped = await AuditRecord.objects.aget(event="console.call_stopped")
    assert stopped.username == "boss"
    assert stopped.detail == {"call_id": "a" * 32, "tool": "terminal_exec", "summary": "sleep 100", "user": "agent"}


@db
async def test_stopping_a_background_command_needs_one_and_the_executor(
    page: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_socket, "registered", lambda: None)  # as in a process that serves no /mcp
    answer = await act(page, {"action": "stop_background", "id": 424242})
    assert answer["ok"] is False and answer["message"] == "there is no background command #424242"
    row = await BackgroundProcess.objects.acreate(
        pid=4242, pgid=4242, start_ticks=1, command="sleep 300", log_path="/tmp/x.log", credential="bearer:5",
        username="agent", instance_id="i" * 32,
    )  # fmt: skip
    answer = await act(page, {"action": "stop_background", "id": row.pk})
    assert answer["ok"] is False and answer["message"] == "the executor cannot be reached from this process"
