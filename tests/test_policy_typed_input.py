"""Interactive shells and the policy (issue 31: `terminal_exec_background {"command": "bash", "stdin": true}`, then
`terminal_input` with `sudo -n true; rm -rf ~`, ran unasked): a shell or interpreter started with its input open
is opaque, and a line typed into it is decided like a command before it reaches it. The rules of evaluate.py
first, then the whole path through the in-process /mcp application."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from mcpserver.policy.commands import InputReader
from mcpserver.policy.evaluate import Caller, CallFacts, Job, Verdict, evaluate
from mcpserver.policy.recommended import RECOMMENDED, recommended_policy
from mcpserver.policy.shell import parse_command
from tests.inprocess import InProcessServer, new_token, text_of
from tests.test_policy_dispatch_inprocess import DEADLINE, answer_when_asked, call_while, set_policy

ALICE = Caller("alice", "laptop", None, frozenset({"mcp"}))
POLICY = recommended_policy()
BASH = Job("bash", "/srv/ws/app")


def decide(tool: str, arguments: dict[str, Any], job: Job | None = None) -> Verdict:
    facts = CallFacts(tool, arguments, ALICE, "/srv/ws", "/home/agent", ("/srv/ws/app",), job)
    return evaluate(POLICY, facts)


def typed(text: object, job: Job | None = BASH) -> Verdict:
    return decide("terminal_input", {"id": 4242, "text": text}, job)


# Starting a command with its input open


@pytest.mark.parametrize(
    ("command", "reader"),
    [
        ("bash", InputReader("bash", True)),
        ("sh -i", InputReader("sh", True)),
        ("exec zsh", InputReader("zsh", True)),
        ("cd /tmp && bash -s", InputReader("bash", True)),
        ("su", InputReader("su", True)),
        ("sudo -i", InputReader("sudo -i", True)),
        ("chroot /", InputReader("chroot", True)),
        ("busybox sh", InputReader("sh", True)),
        ("ssh localhost", InputReader("ssh", True)),
        ("python3", InputReader("python3", False)),
        ("python3 -i setup.py", InputReader("python3", False)),
        ("node", InputReader("node", False)),
        ("psql mydb", InputReader("psql", False)),
        ("sqlite3 app.db", InputReader("sqlite3", False)),
    ],
)
def test_a_command_that_runs_what_is_typed_into_it_is_a_reader(command: str, reader: InputReader) -> None:
    parsed = parse_command(command, terminal=True)
    assert parsed.readers == (reader,) and parsed.opaque
    assert parse_command(command).readers == ()  # its input is /dev/null: nothing is typed


@pytest.mark.parametrize("command", ["cat", "bash deploy.sh", "python3 -m http.server", "read -p 'Name: ' n", "bc"])
def test_a_command_reading_its_input_as_data_is_no_reader(command: str) -> None:
    assert parse_command(command, terminal=True).readers == ()


@pytest.mark.parametrize("mode", [{"stdin": True}, {"pty": True}])
@pytest.mark.parametrize("command", ["bash", "sh -i", "python3", "psql", "nohup bash"])
def test_a_shell_or_interpreter_started_with_its_input_open_is_opaque(command: str, mode: dict[str, bool]) -> None:
    verdict = decide("terminal_exec_background", {"command": command, **mode})
    assert (verdict.decision, verdict.rule_id) == ("ask", "opaque")
    assert "runs what is typed into its input later" in verdict.reason
    assert decide("terminal_exec_background", {"command": command}).decision == "allow"


def test_a_command_reading_data_from_its_input_is_not_asked_about() -> None:
    assert decide("terminal_exec_background", {"command": "cat > notes.txt", "stdin": True}).decision == "allow"


# What is typed into a job


@pytest.mark.parametrize(
    ("text", "decision", "rule_id"),
    [
        ("sudo -n true; rm -rf ~\n", "ask", "privilege"),
        ("rm -rf ~\n", "ask", "rm-recursive-outside-repos"),
        ("git push --force origin main\n", "ask", "force-push"),
        ("echo x >> ~/.bashrc\n", "ask", "home-dotfiles"),
        ("shutdown -h now\n", "deny", "power-off"),
        ("ls -la\n", "allow", "default"),
        ("cd src\nmake test\n", "allow", "default"),
        # The shell may have changed directory since it started: a relative path may be anywhere.
        ("rm -rf build\n", "ask", "rm-recursive-outside-repos"),
        ("python3\n", "ask", "opaque"),
        ('eval "$X"\n', "ask", "opaque"),
        # What the policy cannot tell the job will run from the text alone.
        ("sud", "ask", "opaque"),
        ("ls \\\n", "ask", "opaque"),
        ("/usr/bin/sud\t -n true\n", "ask", "opaque"),
        ("\x1b[A\n", "ask", "opaque"),
        ("reboo\x7ft\n", "ask", "opaque"),
        ("ls\r", "ask", "opaque"),
        (["sudo", "id"], "ask", "opaque"),
        # Keys that run nothing, and nothing at all.
        ("\x03", "allow", "default"),
        ("\x04", "allow", "default"),
        ("", "allow", "default"),
    ],
)
def test_text_typed_into_a_shell_is_decided_as_a_command(text: object, decision: str, rule_id: str) -> None:
    verdict = typed(text)
    assert (verdict.decision, verdict.rule_id) == (decision, rule_id), verdict.reason


def test_a_line_cut_in_two_is_asked_about_at_its_first_half() -> None:
    verdict = typed("r")
    assert (verdict.decision, verdict.rule_id) == ("ask", "opaque")
    assert "does not end its line" in verdict.reason


def test_text_typed_into_an_interpreter_is_opaque() -> None:
    verdict = typed("print(1)\n", Job("python3", ""))
    assert (verdict.decision, verdict.rule_id) == ("ask", "opaque")
    assert "typed into `python3`" in verdict.reason


def test_text_typed_into_a_job_that_reads_data_is_not_a_command() -> None:
    assert typed("sudo rm -rf /\n", Job("cat > notes.txt", "")).decision == "allow"
    assert typed("y\n", Job("read -p 'Go on? ' answer", "")).decision == "allow"


def test_a_job_not_known_yet_is_taken_for_a_shell() -> None:
    assert typed("sudo -n id\n", Job(None)).rule_id == "privilege"
    assert typed("sudo -n id\n", None).rule_id == "privilege"


def test_a_whole_call_rule_about_terminal_input_still_decides() -> None:
    policy = {"rules": [{"id": "no-typing", "decision": "deny", "tools": ["terminal_input"]}]}
    from mcpserver.policy.rules import Policy

    facts = CallFacts("terminal_input", {"id": 1, "text": "y\n"}, ALICE, "/srv/ws", "/home/agent", (), Job("cat"))
    assert evaluate(Policy.from_dict(policy), facts).rule_id == "no-typing"


# Through /mcp


async def follow(app: InProcessServer, token: str, pid: int) -> str:
    """The job's whole output once it has ended."""
    with anyio.fail_after(DEADLINE):
        while True:
            found = await app.call_tool(token, "terminal_output", {"id": pid, "wait_ms": 5000})
            if found["structuredContent"]["state"] != "running":
                return text_of(found)


@pytest.mark.inprocess
@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_line_typed_into_a_shell_is_asked_about_before_the_shell_sees_it(mcp_app: InProcessServer) -> None:
    await set_policy(*RECOMMENDED)
    token = await new_token("typing")
    started, request = await call_while(
        mcp_app, token, "terminal_exec_background", {"command": "bash", "stdin": True}, answer_when_asked(True)
    )
    assert request.rule_id == "opaque" and not started["isError"], text_of(started)
    pid = int(text_of(started).split()[1])
    marker = uuid.uuid4().hex
    hostile = f"sudo -n true; touch {marker}; rm -rf /tmp/{marker}-never\n"
    denied, asked = await call_while(
        mcp_app, token, "terminal_input", {"id": pid, "text": hostile}, answer_when_asked(False, "not there")
    )
    assert (asked.tool, asked.rule_id, asked.user_may_approve) == ("terminal_input", "privilege", False)
    assert (
        text_of(denied)
        == f"Error: root-admin denied this call (request {asked.label}, policy rule privilege): not there"
    )
    second = uuid.uuid4().hex
    plain = await mcp_app.call_tool(token, "terminal_input", {"id": pid, "text": f"echo {second}\n", "eof": True})
    assert not plain["isError"], text_of(plain)
    output = await follow(mcp_app, token, pid)
    assert second in output and not (mcp_app.workspace / marker).exists()
