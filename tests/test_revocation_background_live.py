"""Revoking one credential, by any route, stops every background process it started (and only those), through the
executor, and the audit log says so: the admin's bearer-token action, `manage.py revoke_token` (another process),
revoking an OAuth client, revoking an OAuth access token and a reused refresh token (its family revoked); also a
revocation made in another server process."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.live import LiveServer, apoll, live_group_members, make_replica, mcp_client, running_server, text_of
from tests.oauth_flow import (
    AdminSession,
    application_id,
    audit_events,
    bearer_token_id,
    hidden_inputs,
    newest_access_token_id,
    obtain_tokens,
    refresh,
    register,
)

pytestmark = [pytest.mark.live, pytest.mark.anyio]
DEADLINE = 20.0
STARTED: list[int] = []  # background process groups (pgid = pid)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tmp_path_factory.mktemp("revoke-bg"), SANDSTORM_REGISTRATION_RATE_LIMIT="0") as live:
        yield live


@pytest.fixture(scope="module", autouse=True)
def end_what_was_started(server: LiveServer) -> Iterator[None]:
    """Whatever the tests leave running (a bystander's process, or all of them when a test fails) is ended; only
    processes in this server's workspace, should a pid have been reused meanwhile."""
    yield
    for pid in STARTED:
        for member in live_group_members(pid):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(member)
                if process.cwd().startswith(str(server.workspace)):
                    process.kill()


@pytest.fixture(scope="module")
def admin(server: LiveServer) -> Iterator[AdminSession]:
    session = AdminSession(server)
    yield session
    session.close()


def running(pid: int) -> bool:
    """Whether the background process, or anything left in its group, still runs (a zombie has ended)."""
    try:
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    return alive or bool(live_group_members(pid))


async def start_background(server: LiveServer, token: str) -> int:
    async with mcp_client(server.mcp_url, token) as client:
        started = await client.call_tool("terminal_exec_background", {"command": f"sleep 300; echo {uuid.uuid4().hex}"})
    assert not started.is_error, text_of(started)
    found = re.search(r"PID: (\d+)", text_of(started))
    assert found is not None, text_of(started)
    pid = int(found[1])
    STARTED.append(pid)
    assert running(pid)
    return pid


def run_admin_action(admin: AdminSession, changelist: str, action: str, pk: int | str) -> str:
    page = admin.http.get(changelist)
    data = {**hidden_inputs(page.text, "changelist-form"), "action": action, "_selected_action": str(pk), "index": "0"}
    answer = admin.http.post(
        changelist, data=data, headers={"Referer": f"{admin.server.url}{changelist}"}, follow_redirects=True
    )
    assert answer.status_code == 200
    return answer.text


def stopped_pids(server: LiveServer) -> set[int]:
    return {pid for event in audit_events(server, "credentials.background_stopped") for pid in event["detail"]["pids"]}


async def assert_stopped_and_audited(server: LiveServer, pid: int, kept: list[int]) -> None:
    await apoll(lambda: not running(pid), DEADLINE, f"background process {pid} of the revoked credential to end")
    await apoll(lambda: pid in stopped_pids(server), DEADLINE, "an audit record of the stop")
    for other in kept:
        assert running(other), f"background process {other} of another credential was touched"
        assert other not in stopped_pids(server)


@pytest.fixture
async def token_b(server: LiveServer, anyio_backend: str) -> tuple[str, int]:
    """A background process of another bearer token, which no revocation here may touch."""
    token = server.create_token(f"bystander-{uuid.uuid4().hex[:8]}")
    pid = await start_background(server, token)
    return token, pid


async def test_the_admins_revoke_action_stops_the_tokens_background_processes(
    server: LiveServer, admin: AdminSession, token_b: tuple[str, int]
) -> None:
    name = f"a-{uuid.uuid4().hex[:8]}"
    pid = await start_background(server, server.create_token(name))
    text = run_admin_action(admin, "/admin/oauth/bearertoken/", "revoke", bearer_token_id(server, name))
    assert "Revoked 1 token" in text and "background processes" in text
    await assert_stopped_and_audited(server, pid, kept=[token_b[1]])
    [event] = [e for e in audit_events(server, "credentials.background_stopped") if pid in e["detail"]["pids"]]
    assert event["detail"]["reason"] == "bearer" and event["detail"]["revoked_by"] == "admin"
    assert event["detail"]["credentials"] == [f"bearer:{bearer_token_id(server, name)}"]


async def test_revoke_token_on_the_shell_stops_the_tokens_background_processes(
    server: LiveServer, token_b: tuple[str, int]
) -> None:
    name = f"a-{uuid.uuid4().hex[:8]}"
    token = server.create_token(name)
    pids = [await start_background(server, token), await start_background(server, token)]
    server.manage("revoke_token", name)
    for pid in pids:
        await assert_stopped_and_audited(server, pid, kept=[token_b[1]])


async def test_revoke_token_stops_them_itself_while_no_server_runs(
    server: LiveServer, token_b: tuple[str, int]
) -> None:
    """The command, in development, reaches the processes through an executor of its own (the same OS user)."""
    name = f"a-{uuid.uuid4().hex[:8]}"
    pid = await start_background(server, server.create_token(name))
    server.stop()
    try:
        server.manage("revoke_token", name)
        assert not running(pid), "stopped before the command returned"
        assert running(token_b[1])
    finally:
        server.start()
    assert pid in stopped_pids(server)


async def test_revoking_an_oauth_client_stops_its_background_processes(
    server: LiveServer, admin: AdminSession, token_b: tuple[str, int]
) -> None:
    client, kept_client = register(server, client_name="Revoke me"), register(server, client_name="Keep me")
    tokens, kept = obtain_tokens(server, admin, client), obtain_tokens(server, admin, kept_client)
    pid = await start_background(server, str(tokens["access_token"]))
    kept_pid = await start_background(server, str(kept["access_token"]))
    pk = application_id(server, client.client_id)
    assert "Revoked the tokens of 1 client" in run_admin_action(admin, "/admin/oauth/connectedapp/", "revoke", pk)
    await assert_stopped_and_audited(server, pid, kept=[token_b[1], kept_pid])


async def test_revoking_an_oauth_access_token_stops_its_background_processes(
    server: LiveServer, admin: AdminSession, token_b: tuple[str, int]
) -> None:
    client, kept_client = register(server), register(server)
    tokens, kept = obtain_tokens(server, admin, client), obtain_tokens(server, admin, kept_client)
    pid = await start_background(server, str(tokens["access_token"]))
    kept_pid = await start_background(server, str(kept["access_token"]))
    pk = newest_access_token_id(server, client.client_id)
    run_admin_action(admin, "/admin/oauth/connectedappaccesstoken/", "revoke", pk)
    await assert_stopped_and_audited(server, pid, kept=[token_b[1], kept_pid])


async def test_a_reused_refresh_token_stops_the_background_processes_of_its_client(
    server: LiveServer, admin: AdminSession, token_b: tuple[str, int]
) -> None:
    """A refresh token presented twice was stolen: the toolkit revokes its family, and that is a revocation too."""
    client, kept_client = register(server), register(server)
    tokens, kept = obtain_tokens(server, admin, client), obtain_tokens(server, admin, kept_client)
    kept_pid = await start_background(server, str(kept["access_token"]))
    rotated = refresh(server, client, str(tokens["refresh_token"]))
    assert rotated.status_code == 200, rotated.text
    pid = await start_background(server, str(rotated.json()["access_token"]))
    assert refresh(server, client, str(tokens["refresh_token"])).status_code == 400  # the reuse
    await assert_stopped_and_audited(server, pid, kept=[token_b[1], kept_pid])
    [event] = [e for e in audit_events(server, "credentials.background_stopped") if pid in e["detail"]["pids"]]
    assert event["detail"]["reason"] == "refresh_reuse"


async def test_a_revocation_in_another_server_process_stops_the_processes_this_one_started(
    server: LiveServer, tmp_path: Path, token_b: tuple[str, int]
) -> None:
    name = f"a-{uuid.uuid4().hex[:8]}"
    pid = await start_background(server, server.create_token(name))
    replica = make_replica(server, tmp_path / "replica")
    replica.start()
    try:
        other_admin = AdminSession(replica)
        run_admin_action(other_admin, "/admin/oauth/bearertoken/", "revoke", bearer_token_id(server, name))
        other_admin.close()
        await assert_stopped_and_audited(server, pid, kept=[token_b[1]])
        assert (
            len([e for e in audit_events(server, "credentials.background_stopped") if pid in e["detail"]["pids"]]) == 1
        )
    finally:
        replica.stop()
