"""Revoking one credential, by any route, stops every background process it started (and only those), through the
executor, and the audit log says so: the admin's bearer-token action, `manage.py revoke_token` (another process),
revoking an OAuth client, revoking an OAuth access token and a reused refresh token (its family revoked); also a
revocation made in another server process."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
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


# A foreground command that leaves two processes running past its own end, in sessions of their own: one started
# straight from its shell, one through a subshell that exits at once (a double fork: its parent is gone too).
LEAVE_BEHIND = (
    "setsid bash -c 'exec -a xM{m} sleep 283' </dev/null >/dev/null 2>&1 & "
    "(setsid bash -c 'exec -a xD{m} sleep 283' </dev/null >/dev/null 2>&1 &); echo left"
)


def marked(marker: str) -> list[int]:
    """Live processes whose command line carries `marker`."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(process.info["cmdline"] or []):
            found.append(process.pid)
    return sorted(found)


async def leave_behind(server: LiveServer, token: str) -> tuple[str, list[int]]:
    marker = uuid.uuid4().hex[:12]
    async with mcp_client(server.mcp_url, token) as client:
        result = await client.call_tool("terminal_exec", {"command": LEAVE_BEHIND.format(m=marker)})
    assert not result.is_error and "left" in text_of(result), text_of(result)
    pids = await apoll(lambda: found if len(found := marked(marker)) == 2 else None, DEADLINE, "both left behind")
    return marker, pids


async def test_revoking_ends_what_a_foreground_command_left_running_in_sessions_of_its_own(
    server: LiveServer, token_b: tuple[str, int]
) -> None:
    health = httpx2.get(f"{server.url}/health", timeout=5).json()
    assert health["executor"]["confinement"]["process_groups"] == "tracked", health
    kept_marker, kept = await leave_behind(server, token_b[0])
    name = f"a-{uuid.uuid4().hex[:8]}"
    marker, pids = await leave_behind(server, server.create_token(name))
    try:
        await asyncio.sleep(0.5)
        assert marked(marker) == pids, "the call's end left them running (as a shell would)"
        server.manage("revoke_token", name)
        await apoll(lambda: not marked(marker), DEADLINE, "what the revoked token's command left running to end")
        assert marked(kept_marker) == kept, "another credential's were touched"
        events = audit_events(server, "credentials.processes_stopped")
        [event] = [e for e in events if set(pids) <= set(e["detail"]["pids"])]
        assert event["detail"]["credentials"] == [f"bearer:{bearer_token_id(server, name)}"]
        assert event["detail"]["reason"] == "bearer"
        commands = " ".join(event["detail"]["commands"])
        assert f"xM{marker}" in commands and f"xD{marker}" in commands
    finally:
        for pid in [*marked(marker), *marked(kept_marker)]:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
