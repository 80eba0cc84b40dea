"""`python -m bench.toolkit_edit` (and the other sections with a `measure(server, sizes)`): one section by hand, on a
server of its own in a temporary workspace, with the quick sizes; its figures printed as JSON."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.sections import Sizes
from tests.live import LiveServer, running_server

Measure = Callable[[LiveServer, Sizes], Coroutine[Any, Any, dict[str, Any]]]


def quick_look(measure: Measure) -> None:
    with tempfile.TemporaryDirectory() as root, running_server(Path(root)) as server:
        print(json.dumps(asyncio.run(measure(server, Sizes.quick())), indent=2))
