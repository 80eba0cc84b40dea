"""The kill switch: "Rotate all credentials" in the admin and `manage.py rotate_tokens`, and per-credential
revocation of OAuth clients in the admin."""

from __future__ import annotations

import getpass
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.live import LiveServer, apoll, live_pids_with, mcp_client, running_server, text_of
from tests.oauth_flow import (
    MCP_HEADERS,
    AdminSession,
    application_id,
    audit_events,
    hidden_inputs,
    mcp_status,
    newest_access_token_id,
    obtain_tokens,
    refresh,
    register,
    shell,
)

pytestmark = [pytest.mark.live]
ROTATE_PAGE = "/admin/oauth/credentialrotation/"
RESULT_PAGE = re.compile(r"^/admin/oauth/credentialrotation/result/[\w-]+/$")
DEADLINE = 20.0


def secret_on(page: str) -> str:
    found = re.search(r'id="token-secret"[^>]*>([^<]+)<', page)
    assert found is not None, "the new token is shown"
    return found[1].strip()


def create_staff_user(server: LiveServer, username: str, password: str, superuser: bool = False) -> None:
    shell(
        server,
        f"from django.contrib.auth import get_user_model; get_user_model().objects.create_user("
        f"{username!r}, password={password!r}, is_staff=True, is_superuser={superuser!r})",
    )


async def long_call(client: Any, marker: str, results: dict[str, Any]) -> None:
    results["call"] = await client.call_tool("terminal_exec", {"command": f"sleep 300; echo {marker}", "timeout": 290})


@pytest.mark.anyio
async def test_rotating_in_the_admin_cuts_off_bearer_and_oauth_credentials_at_once(tmp_path: Path) -> None:
    with running_server(tmp_path, SANDSTORM_REGISTRATION_RATE_LIMIT="0") as server:
        admin, other_admin = AdminSession(server), AdminSession(server)
        bearer = server.create_token("before-rotation")
        client = register(server)
        tokens = obtain_tokens(server, admin, client)
        call_marker, background_marker = uuid.uuid4().hex, uuid.uuid4().hex
        results: dict[str, Any] = {}
        async with (
            mcp_client(server.mcp_url, bearer) as by_bearer,
            mcp_client(server.mcp_url, str(tokens["access_token"])) as by_oauth,
        ):
            started = await by_oauth.call_tool(
                "terminal_exec_background", {"command": f"sleep 300; echo {background_marker}"}
            )
            assert not started.is_error
            async with anyio.create_task_group() as group:
                group.start_soon(long_call, by_bearer, call_marker, results)
                await apoll(lambda: live_pids_with(call_marker), DEADLINE, "the long call to start")
                page = await anyio.to_thread.run_sync(admin.http.get, ROTATE_PAGE)
                assert page.status_code == 200
                assert re.search(r'id="count-bearer">2<', page.text), "bootstrap + before-rotation"
                assert re.search(r'id="count-clients">1<', page.text)
                assert re.search(r'id="count-sessions">1<', page.text), "the other admin session"
                form = {**hidden_inputs(page.text, "rotate-form"), "stop_background": "on"}
                done = await anyio.to_thread.run_sync(
                    lambda: admin.http.post(ROTATE_PAGE, data=form, headers={"Referer": f"{server.url}{ROTATE_PAGE}"})
                )
        assert done.status_code == 302 and RESULT_PAGE.match(done.headers["location"]), "POST -> redirect -> GET"
        shown = admin.http.get(done.headers["location"])
        assert shown.status_code == 200 and "no-store" in shown.headers["cache-control"]
        new_token = secret_on(shown.text)
        again = admin.http.get(done.headers["location"])
        assert new_token not in again.text and "already shown" in again.text

        assert results["call"].is_error and "cancelled" in text_of(results["call"])
        assert live_pids_with(call_marker) == []
        await apoll(lambda: not live_pids_with(background_marker), DEADLINE, "the background process to be stopped")

        assert mcp_status(server, bearer).status_code == 401
        assert mcp_status(server, server.token).status_code == 401
        assert mcp_status(server, str(tokens["access_token"])).status_code == 401
        assert refresh(server, client, str(tokens["refresh_token"])).json()["error"] == "invalid_grant"
        assert mcp_status(server, new_token).status_code == 200
        assert other_admin.http.get("/admin/").status_code == 302, "other admin sessions are signed out"
        assert admin.http.get("/admin/").status_code == 200, "the rotating admin stays signed in"
        assert new_token not in admin.http.get(ROTATE_PAGE).text, "shown once"

        [rotated] = audit_events(server, "credentials.rotated")
        assert rotated["username"] == "admin" and rotated["credential_kind"] == "session"
        detail = rotated["detail"]
        assert (detail["bearer_tokens"], detail["clients"], detail["sessions"]) == (2, 1, 1)
        assert (detail["access_tokens"], detail["registration_tokens"], detail["refresh_tokens"]) == (1, 1, 1)
        assert detail["stop_background"] is True
        assert "Revoked 2 bearer tokens, 1 OAuth access token, 1 refresh token" in shown.text
        admin.close()
        other_admin.close()


@pytest.mark.anyio
async def test_rotate_tokens_from_the_shell_cancels_calls_in_the_server_and_can_keep_bearer_tokens(
    tmp_path: Path,
) -> None:
    with running_server(tmp_path, SANDSTORM_REGISTRATION_RATE_LIMIT="0") as server:
        create_staff_user(server, "ops", "ops-password-123")
        admin = AdminSession(server)
        tokens = obtain_tokens(server, admin, register(server))
        opened = mcp_status(server, str(tokens["access_token"]))  # an MCP session, open before the rotation
        session_headers = {
            **MCP_HEADERS,
            "Authorization": f"Bearer {tokens['access_token']}",
            "Mcp-Session-Id": opened.headers["mcp-session-id"],
        }
        marker, results = uuid.uuid4().hex, dict[str, Any]()
        async with mcp_client(server.mcp_url, str(tokens["access_token"])) as by_oauth:
            async with anyio.create_task_group() as group:
                group.start_soon(long_call, by_oauth, marker, results)
                await apoll(lambda: live_pids_with(marker), DEADLINE, "the long call to start")
                rotated = await anyio.to_thread.run_sync(
                    lambda: server.manage("rotate_tokens", "--user", "ops", "--keep-bearer")
                )
        assert "cancelled" in text_of(results["call"]) and live_pids_with(marker) == []
        # The call's record says who stopped it and how: the rotation, by the OS user who ran the command.
        [stopped] = server.database.query(
            "SELECT f.reason FROM audit_auditrecord f JOIN audit_auditrecord s ON s.call_id = f.call_id "
            "WHERE f.kind = 'call.finished' AND s.kind = 'call.started' AND CAST(s.arguments AS TEXT) LIKE %s",
            f"%{marker}%",
        )
        assert stopped["reason"] == f"cancelled: all credentials were rotated by {getpass.getuser()}", stopped

        new_token = rotated.stdout.strip().splitlines()[-1]
        assert rotated.stdout.strip() == new_token, "the token alone, on the last line"
        assert "Rotated" in rotated.stderr
        owner = server.database.one(
            "SELECT u.username FROM oauth_bearertoken t JOIN auth_user u ON u.id = t.user_id WHERE t.prefix = %s",
            new_token[:8],
        )
        assert owner["username"] == "ops"
        assert mcp_status(server, new_token).status_code == 200
        assert mcp_status(server, server.token).status_code == 200, "--keep-bearer"
        assert mcp_status(server, str(tokens["access_token"])).status_code == 401
        listing = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
        assert httpx2.post(server.mcp_url, json=listing, headers=session_headers, timeout=10).status_code == 401
        assert admin.http.get("/admin/").status_code == 302, "every admin session is signed out"
        [event] = audit_events(server, "credentials.rotated")
        assert event["credential_kind"] == "shell" and event["detail"]["kept_bearer_tokens"] is True
        admin.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("oauth-revoke"), SANDSTORM_REGISTRATION_RATE_LIMIT="0") as live:
        yield live


def run_admin_action(admin: AdminSession, changelist: str, action: str, pk: int | str) -> httpx2.Response:
    page = admin.http.get(changelist)
    form = hidden_inputs(page.text, "changelist-form")
    data = {**form, "action": action, "_selected_action": str(pk), "index": "0"}
    return admin.http.post(
        changelist, data=data, headers={"Referer": f"{admin.server.url}{changelist}"}, follow_redirects=True
    )


def test_revoking_a_client_in_the_admin_cuts_off_its_tokens_and_is_audited(server: LiveServer) -> None:
    admin = AdminSession(server)
    client = register(server, client_name="Revoke me")
    keep = register(server, client_name="Keep me")
    tokens, kept = obtain_tokens(server, admin, client), obtain_tokens(server, admin, keep)
    pk = application_id(server, client.client_id)
    answer = run_admin_action(admin, "/admin/oauth/connectedapp/", "revoke", pk)
    assert "Revoked the tokens of 1 client" in answer.text
    assert mcp_status(server, str(tokens["access_token"])).status_code == 401
    assert refresh(server, client, str(tokens["refresh_token"])).status_code == 400
    assert mcp_status(server, str(kept["access_token"])).status_code == 200
    recorded = [e for e in audit_events(server, "oauth.client_revoked") if e["detail"]["client_id"] == client.client_id]
    assert len(recorded) == 1 and recorded[0]["username"] == "admin"
    admin.close()


def test_revoking_an_access_token_in_the_admin_revokes_its_refresh_token_too(server: LiveServer) -> None:
    admin = AdminSession(server)
    client = register(server)
    tokens = obtain_tokens(server, admin, client)
    pk = newest_access_token_id(server)
    run_admin_action(admin, "/admin/oauth/connectedappaccesstoken/", "revoke", pk)
    assert mcp_status(server, str(tokens["access_token"])).status_code == 401
    assert refresh(server, client, str(tokens["refresh_token"])).status_code == 400
    assert any(e["detail"]["token_id"] == pk for e in audit_events(server, "oauth.token_revoked"))
    admin.close()


def test_the_rotation_page_is_for_superusers_only_and_linked_from_the_admin_index(server: LiveServer) -> None:
    admin = AdminSession(server)
    index = admin.http.get("/admin/").text
    assert f'href="{ROTATE_PAGE}"' in index and "Rotate all credentials" in index
    admin.close()
    create_staff_user(server, "helper", "helper-password-123")
    staff = AdminSession(server, "helper", "helper-password-123")
    assert staff.http.get(ROTATE_PAGE).status_code == 403
    assert staff.http.get(f"{ROTATE_PAGE}result/some-ticket/").status_code == 403
    assert ROTATE_PAGE not in staff.http.get("/admin/").text
    staff.close()


def test_an_oauth_client_list_never_shows_token_values(server: LiveServer) -> None:
    admin = AdminSession(server)
    tokens = obtain_tokens(server, admin, register(server))
    for page in (
        "/admin/oauth/connectedappaccesstoken/",
        "/admin/oauth/connectedapprefreshtoken/",
        "/admin/oauth/connectedapp/",
    ):
        text = admin.http.get(page).text
        assert str(tokens["access_token"]) not in text and str(tokens["refresh_token"]) not in text
    stored = [row["token"] for row in server.database.query("SELECT token FROM oauth2_provider_accesstoken")]
    assert set(stored) == {""}, "only checksums are stored"
    admin.close()
