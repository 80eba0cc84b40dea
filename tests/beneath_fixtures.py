"""Fixtures of the executor's file tests, imported by name where they are used: every test of such a module runs
with paths opened by openat2 and again with the O_NOFOLLOW walk, in a fresh workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcpserver.executor import beneath


@pytest.fixture(autouse=True, params=["openat2", "walk"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs twice: paths opened with openat2, and with the O_NOFOLLOW walk used where it is missing."""
    if request.param == "openat2" and not beneath.openat2_available():
        pytest.skip("this kernel (or its seccomp filter) has no openat2")
    if request.param == "walk":
        monkeypatch.setattr(beneath, "USE_OPENAT2", False)
    return str(request.param)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return Path(os.path.realpath(root))
