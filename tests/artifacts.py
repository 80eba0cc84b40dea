"""Where a test run keeps what a person should look at afterwards (screenshots of the console): the directory
$SANDSTORM_TEST_ARTIFACTS names, or var/test-artifacts/ in the checkout."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "var" / "test-artifacts"


def artifact_dir() -> Path:
    directory = Path(os.environ.get("SANDSTORM_TEST_ARTIFACTS") or DEFAULT)
    directory.mkdir(parents=True, exist_ok=True)
    return directory
