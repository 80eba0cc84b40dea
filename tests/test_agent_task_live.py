"""One agent task end to end, as a model would do it with the toolkit: clone a small repository whose test fails,
find the bug with file_grep, fix it with file_edit, run the tests in the background and follow them with
terminal_output, commit. Every tools/call is one round trip; the count is printed (the issue asks for it) and held
to what the task needs, so a tool that makes an agent retry shows here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from mcp import Client

from tests.live import LiveServer, mcp_client, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

BUGGY = '''def add(a, b):
    """The sum of a and b."""
    return a - b


def double(a):
    return add(a, a)
'''
TESTS = """import unittest

from calc import add, double


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_double(self):
        self.assertEqual(double(4), 8)


if __name__ == "__main__":
    unittest.main()
"""


@pytest.fixture
def calc_remote(tmp_path: Path, git_env: dict[str, str]) -> Path:
    """A bare repository outside the workspace holding calc.py (with the bug) and its tests."""
    work, bare = tmp_path / "calc-src", tmp_path / "calc.git"
    work.mkdir()
    (work / "calc.py").write_text(BUGGY)
    (work / "test_calc.py").write_text(TESTS)
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "Calculator"]):
        subprocess.run(["git", *args], cwd=work, env=git_env, check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], env=git_env, check=True)
    return bare


class Agent:
    """The SDK client, counting round trips."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.round_trips = 0

    async def call(self, tool: str, **arguments: object) -> tuple[str, dict[str, object] | None]:
        self.round_trips += 1
        result = await self.client.call_tool(tool, arguments)
        assert not result.is_error, f"{tool} failed: {text_of(result)}"
        return text_of(result), result.structured_content


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_agent_fixes_a_failing_test_and_commits(
    live_server: LiveServer, tool_token: str, workspace_dir: Path, calc_remote: Path, mode: str
) -> None:
    clone = workspace_dir / "calc"
    async with mcp_client(live_server.mcp_url, tool_token, mode=mode) as client:
        agent = Agent(client)
        await agent.call("git_clone", repo_url=calc_remote.as_uri(), path=str(clone))

        failing = await client.call_tool("terminal_exec", {"command": "python3 -B -m unittest -q", "cwd": str(clone)})
        agent.round_trips += 1
        assert failing.is_error and "FAILED (failures=" in text_of(failing)

        text, found = await agent.call(
            "file_grep", pattern=r"return a\s*-\s*b", path=str(clone), output_mode="content", line_numbers=True
        )
        assert found is not None and "calc.py:3:" in text

        diff, edited = await agent.call(
            "file_edit", path=str(clone / "calc.py"), old_string="return a - b", new_string="return a + b"
        )
        assert edited is not None and edited["replacements"] == 1
        assert "-    return a - b" in diff and "+    return a + b" in diff

        started, _ = await agent.call(
            "terminal_exec_background", command="sleep 0.5; python3 -B -m unittest -v", cwd=str(clone)
        )
        job = int(started.split()[1])
        followed, state, offset, follows, exit_code = "", "running", 0, 0, None
        while state == "running":  # each wait returns with the next output, or the end
            text, seen = await agent.call("terminal_output", id=job, offset=offset, wait_ms=20_000)
            follows += 1
            assert seen is not None and (seen["next_offset"] != offset or seen["state"] != "running")
            followed += text.split("\n\n", 1)[1] if "\n\n" in text else ""
            state, offset, exit_code = str(seen["state"]), int(str(seen["next_offset"])), seen["exit_code"]
        assert state == "exited" and exit_code == 0, followed
        assert "Ran 2 tests" in followed and "\nOK" in followed

        await agent.call("git_commit", message="Fix add: it subtracted", path=str(clone))
        log, _ = await agent.call("git_log", n=1, path=str(clone))
        assert "Fix add: it subtracted" in log
    assert (clone / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")
    print(f"agent task ({mode}): {agent.round_trips} round trips")
    # clone, run, grep, edit, start the tests, commit, log; and the follow: a wait per piece of output (python writes
    # its report in one or two pieces, as it ends), none answered empty
    assert agent.round_trips - follows == 7 and follows <= 3
