"""workspace_info and workspace_install over MCP against the live server."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mcp import Client

from tests.live import LiveServer, text_of

pytestmark = [pytest.mark.live, pytest.mark.anyio]

PIP_OUTCOMES = ("Requirement already satisfied: pip", "Successfully installed pip", "externally-managed-environment")
SECTIONS = ["OS", "Node", "Git", "Disk", "CWD", "Tools", "Memory"]


async def test_workspace_info_has_the_seven_sections_in_order(tools_client: Client, live_server: LiveServer) -> None:
    result = await tools_client.call_tool("workspace_info", {})
    text = text_of(result)
    assert not result.is_error
    headers = [line for line in text.splitlines() if line.startswith("=== ")]
    assert headers == [f"=== {name} ===" for name in SECTIONS]
    assert f"=== CWD ===\n{live_server.workspace}\n" in text
    assert "=== Git ===\ngit version " in text


async def test_workspace_info_with_an_unexpected_argument_gives_an_error_or_the_whole_report(
    tools_client: Client,
) -> None:
    result = await tools_client.call_tool("workspace_info", {"verbose": True})
    headers = [line for line in text_of(result).splitlines() if line.startswith("=== ")]
    assert result.is_error or headers == [f"=== {name} ===" for name in SECTIONS]


async def test_workspace_install_returns_the_package_managers_output(tools_client: Client) -> None:
    # What pip does here depends on the host (installs, finds it installed, or refuses an "externally managed"
    # python3): the same command through terminal_exec says which, and workspace_install must return just that.
    probe = await tools_client.call_tool("terminal_exec", {"command": "python3 -m pip install pip", "timeout": 120})
    result = await tools_client.call_tool("workspace_install", {"packages": "pip", "manager": "pip"})
    text, expected = text_of(result), text_of(probe)
    assert result.is_error == probe.is_error, text
    assert text.splitlines()[-1] == expected.splitlines()[-1]  # the same exit_code line
    outcome = next(phrase for phrase in PIP_OUTCOMES if phrase in expected)
    assert outcome in text


@pytest.mark.parametrize(
    "packages",
    [
        "left-pad;touch {marker}",
        "left-pad && touch {marker}",
        "left-pad|touch {marker}",
        "$(touch {marker})",
        "`touch {marker}`",
        "left-pad\ntouch {marker}",
        "--index-url=file://{marker}",
    ],
)
async def test_workspace_install_refuses_package_names_a_shell_or_option_parser_would_act_on(
    tools_client: Client, tmp_path: Path, packages: str
) -> None:
    marker = tmp_path / "pwned"
    for manager in ("npm", "pip", "apt"):
        result = await tools_client.call_tool(
            "workspace_install", {"packages": packages.format(marker=marker), "manager": manager}
        )
        assert result.is_error and text_of(result).startswith("Error: invalid package name "), text_of(result)
    assert not marker.exists()


async def test_workspace_install_with_an_unknown_manager_is_refused(tools_client: Client) -> None:
    result = await tools_client.call_tool("workspace_install", {"packages": "left-pad", "manager": "yum"})
    assert result.is_error and "yum" in text_of(result)


async def test_workspace_install_with_apt_gives_a_clear_error_without_passwordless_sudo(tools_client: Client) -> None:
    """apt runs as `sudo -n apt-get install`. What happens depends on the host, and each outcome is a clear error:

    - sudo is missing, or wants a password (a normal user): the error explains that passwordless sudo is needed.
      This is the case in CI and in the dev container (root, no sudo installed).
    - sudo works without a password (root with sudo, or a sudoers rule): apt-get really runs, and the package
      (a name no archive has) is not found: apt's own output comes back as the error.
    - no apt-get at all (not Debian): the error says apt is not installed.
    Nothing is installed in any case.
    """
    package = f"sandstorm-no-such-package-{uuid.uuid4().hex[:8]}"
    result = await tools_client.call_tool("workspace_install", {"packages": package, "manager": "apt"})
    text = text_of(result)
    assert result.is_error
    sudo_refused = text.startswith("Error: installing with apt needs root") and (
        "passwordless sudo" in text or "sudo is not installed" in text
    )
    apt_ran = f"Unable to locate package {package}" in text and "exit_code: 100" in text
    no_apt = text == "Error: apt is not installed"
    assert sudo_refused or apt_ran or no_apt, text
