"""The executor process needs neither Django nor the site package: it holds no settings, database or secrets."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.live import REPO

PROBE = """
import importlib, pkgutil, sys
import mcpserver.executor
import mcpserver.executor.__main__
for module in pkgutil.iter_modules(mcpserver.executor.__path__, "mcpserver.executor."):
    importlib.import_module(module.name)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("django", "sandstorm_site", "oauth", "audit")))
"""


def test_the_executor_and_its_modules_import_without_django_or_the_site() -> None:
    env = {name: value for name, value in os.environ.items() if name != "DJANGO_SETTINGS_MODULE"}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"
