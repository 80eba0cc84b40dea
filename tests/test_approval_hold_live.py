"""Approval against a real server with the official SDK client, the way Claude.ai meets it: a call that nobody
answers before SANDSTORM_APPROVAL_HOLD answers "pending as R-17"; an admin then approves it on the card in headless
Chromium, and the agent reads the command's output with terminal_output by that label. No answer at all within
SANDSTORM_APPROVAL_TIMEOUT is a denial; a timed grant lets the same command shape run without asking."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from playwright.sync_api import Browser, Page

from tests.browser import log_in_as_admin
from tests.live import LiveServer, mcp_client, running_server, text_of

pytestmark = [pytest.mark.live, pytest.mark.browser]
POLICY = {"rules": [{"id": "ask-printf", "decision": "ask", "commands": ["printf"], "description": "printing"}]}
DEADLINE_MS = 15_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("hold")
    with running_server(root, SANDSTORM_APPROVAL_HOLD="2", SANDSTORM_APPROVAL_TIMEOUT="6") as live:
        policy = root / "policy.json"
        policy.write_text(json.dumps(POLICY))
        live.manage("policy_load", str(policy))
        yield live


@pytest.fixture
def page(browser: Browser, server: LiveServer) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    log_in_as_admin(page, server)
    page.goto(f"{server.url}/admin/")
    yield page
    context.close()


async def call(server: LiveServer, tool: str, arguments: dict[str, object]) -> tuple[bool, str, object]:
    async with mcp_client(server.mcp_url, server.token) as client:
        result = await client.call_tool(tool, arguments)
    return result.is_error, text_of(result), result.structured_content


def sdk(server: LiveServer, tool: str, arguments: dict[str, object]) -> tuple[bool, str, object]:
    """One call, in a thread of its own: Playwright's sync API keeps an event loop in the test's thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, call, server, tool, arguments).result(timeout=60)


def test_a_held_call_answers_pending_and_runs_in_the_background_once_approved_on_the_card(
    page: Page, server: LiveServer
) -> None:
    marker = uuid.uuid4().hex
    is_error, text, _ = sdk(server, "terminal_exec", {"command": f"printf 'held %s\\n' {marker}"})
    assert is_error and text.startswith("Pending: this call waits for an administrator's approval as request R-")
    label = text.split("as request ", 1)[1].split(" ", 1)[0]
    _, listed, _ = sdk(server, "terminal_list", {})
    assert f"{label}  pending approval" in listed
    card = page.locator(".approval-card", has_text=marker)
    card.wait_for(timeout=DEADLINE_MS)
    card.get_by_role("button", name="Approve once").click()
    _, output, structured = sdk(server, "terminal_output", {"id": label, "wait_ms": 10_000})
    assert isinstance(structured, dict) and structured["state"] in ("running", "exited")
    for _ in range(20):
        if structured["state"] == "exited":
            break
        _, output, structured = sdk(server, "terminal_output", {"id": label, "wait_ms": 5_000})
        assert isinstance(structured, dict)
    assert structured["state"] == "exited" and f"held {marker}" in output


def test_no_answer_is_a_denial_and_the_command_never_runs(server: LiveServer) -> None:
    marker = uuid.uuid4().hex
    is_error, text, _ = sdk(server, "terminal_exec", {"command": f"printf x > {marker}"})
    assert is_error and text.startswith("Pending:")
    label = text.split("as request ", 1)[1].split(" ", 1)[0]
    is_error, text, _ = sdk(server, "terminal_output", {"id": label, "wait_ms": 15_000})
    assert is_error and text == f"Error: no one answered {label} in time, so it did not run"
    assert not (server.workspace / marker).exists()


def test_a_timed_grant_lets_the_same_command_shape_run_without_asking(page: Page, server: LiveServer) -> None:
    first = uuid.uuid4().hex
    answered: list[tuple[bool, str, object]] = []
    arguments: dict[str, object] = {"command": f"printf '%s' {first}"}
    # The call waits in a thread of its own while the page (Playwright's loop, in this thread) answers it.
    caller = threading.Thread(target=lambda: answered.append(sdk(server, "terminal_exec", arguments)))
    caller.start()
    card = page.locator(".approval-card", has_text=first)
    card.wait_for(timeout=DEADLINE_MS)
    card.locator(".approval-minutes").fill("5")
    card.get_by_role("button", name="Approve this credential for").click()
    caller.join(30)
    assert answered and not answered[0][0] and first in answered[0][1]
    second = uuid.uuid4().hex
    is_error, text, _ = sdk(server, "terminal_exec", {"command": f"printf '%s' {second}"})
    assert not is_error and second in text


def test_the_client_hears_that_the_call_waits_for_an_administrator(server: LiveServer) -> None:
    heard: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(message or "")

    async def waiting_call() -> str:
        async with mcp_client(server.mcp_url, server.token) as client:
            result = await client.call_tool(
                # `printf --`: not the shape the grant test lets through
                "terminal_exec",
                {"command": f"printf -- {uuid.uuid4().hex}"},
                progress_callback=on_progress,
            )
        return text_of(result)

    with ThreadPoolExecutor(max_workers=1) as pool:
        text = pool.submit(anyio.run, waiting_call).result(timeout=60)
    label = text.split("as request ", 1)[1].split(" ", 1)[0]
    assert heard and heard[0].startswith(f"waiting for an administrator: request {label} (")
