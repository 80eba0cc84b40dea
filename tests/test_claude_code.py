"""oauth.claude_code: the one `claude mcp` line every page and command prints, and its copies in shell and docs."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from oauth.claude_code import claude_code_line

REPO = Path(__file__).resolve().parent.parent
URL = "https://mcp.example.com/mcp"
ODD_SECRETS = ["sst_plain-_0123456789", 'it\'s "odd" $(touch pwned) `x` ; & | \\ * ~ !', "new\nline", "  spaced  "]
# A `claude` that records each call's arguments (NUL-separated, a file per call) and fails `remove` as Claude Code does when the
# server is not there yet.
FAKE_CLAUDE = 'n=0; claude() { n=$((n + 1)); printf "%s\\0" "$@" >"calls.$n"; [ "$2" != remove ]; }\n'


def run_in_bash(line: str, tmp_path: Path) -> list[list[str]]:
    result = subprocess.run(
        ["bash", "-c", FAKE_CLAUDE + line], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = sorted(tmp_path.glob("calls.*"), key=lambda path: int(path.suffix[1:]))
    return [path.read_text().split("\0")[:-1] for path in calls]


@pytest.mark.parametrize("secret", ODD_SECRETS)
def test_the_line_is_valid_bash_and_passes_the_secret_as_one_exact_argument(secret: str, tmp_path: Path) -> None:
    line = claude_code_line(URL, secret)
    assert subprocess.run(["bash", "-n", "-c", line], capture_output=True, timeout=10).returncode == 0
    words = shlex.split(line)
    assert words[-2:] == ["--header", f"Authorization: Bearer {secret}"]
    remove, add = run_in_bash(line, tmp_path)
    assert remove == ["mcp", "remove", "-s", "user", "sandstorm"]
    assert add == ["mcp", "add", "-s", "user", "--transport", "http", "sandstorm", URL, "--header",
                   f"Authorization: Bearer {secret}"]  # fmt: skip
    assert not (tmp_path / "pwned").exists()


def test_the_line_works_a_second_time_it_removes_the_earlier_entry_first(tmp_path: Path) -> None:
    line = claude_code_line(URL, "sst_second")
    calls = run_in_bash(f"{line}\n{line}", tmp_path)
    assert [call[1] for call in calls] == ["remove", "add", "remove", "add"]


def test_a_url_with_shell_characters_is_quoted(tmp_path: Path) -> None:
    url = "https://h.example/mcp?a=1&b=$(id)"
    [_, add] = run_in_bash(claude_code_line(url, "sst_x"), tmp_path)
    assert add[7] == url


def test_the_installers_printed_line_is_the_same_line_with_a_placeholder() -> None:
    script = (REPO / "deploy/install.sh").read_text()
    [printed] = re.findall(r"^  Claude Code: +(.*)$", script, flags=re.MULTILINE)
    assert printed.replace("$PUBLIC_URL/mcp", URL) == claude_code_line(URL, "<token>")


def test_the_readmes_make_run_banner_shows_the_line_bootstrap_prints() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"  {claude_code_line('http://127.0.0.1:8080/mcp', 'sst_…')}\n" in readme
    assert "claude mcp add --transport" not in readme, "every line adds for the user (-s user)"
