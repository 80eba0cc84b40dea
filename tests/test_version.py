"""The version is the package's: pyproject.toml's, the CHANGELOG's latest release, and what the MCP server reports."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from mcp import Client

from mcpserver.process import sandstorm_version
from mcpserver.services import build_services
from mcpserver.tool_server import build_server

REPO = Path(__file__).resolve().parent.parent


def latest_release() -> str:
    """The newest `## [x.y.z] - date` heading of CHANGELOG.md ([Unreleased] is not a release)."""
    found = re.search(
        r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE
    )
    assert found, "CHANGELOG.md has no release heading"
    return found.group(1)


def test_the_installed_package_is_pyprojects_version_and_the_changelogs_latest_release() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version("sandstorm-mcp") == declared == latest_release() == "0.2.0"


def test_the_server_reports_the_package_version() -> None:
    assert sandstorm_version() == version("sandstorm-mcp")


@pytest.mark.anyio
async def test_the_mcp_handshake_names_the_package_version_as_server_info() -> None:
    async with Client(build_server(sandstorm_version(), build_services()), mode="legacy") as client:
        info = client.server_info
    assert info is not None and info.name == "sandstorm" and info.version == version("sandstorm-mcp")
