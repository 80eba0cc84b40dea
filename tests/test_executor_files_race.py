"""The file tools against a hostile workspace that swaps a directory and a symlink out of it while they run.

A racer process exchanges `d` (a real directory) and `l` (a symlink to a directory outside) with
`renameat2(RENAME_EXCHANGE)` in a tight loop, so any tool that checks a path and then uses it by name again can be
made to act outside. Each test runs the tools over and over for a bounded time, with openat2 and with the
component walk that replaces it where the kernel lacks it (or a seccomp filter refuses it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcpserver.executor import beneath
from mcpserver.executor.environment import clean_environment
from mcpserver.executor.files import FileOps
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace

pytestmark = pytest.mark.anyio

RACE_SECONDS = 3.0
SECRET = "outside-secret"
MARKER = "only-outside.txt"
OUTSIDE_ENTRIES = sorted(["secret.txt", "victim.txt", MARKER])

# The racer: exchange two names in one atomic step, as fast as it can, for at most 30 s (it is killed sooner).
RACER = """
import ctypes, os, sys, time
SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "armv7l": 382, "ppc64le": 357, "s390x": 347}
number = SYS_RENAMEAT2[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
AT_FDCWD, RENAME_EXCHANGE = -100, 2
if libc.syscall(number, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
    sys.exit("renameat2: errno %d" % ctypes.get_errno())
print("racing", flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    libc.syscall(number, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
"""


class Files(FileOps):
    def __init__(self, root: Path) -> None:
        self.workspace = Workspace(root)
        self.root = str(self.workspace.root)
        self.env = clean_environment()


@pytest.fixture(params=["openat2", "walk"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not beneath.openat2_available():
            pytest.skip("this kernel (or its seccomp filter) has no openat2")
    else:
        monkeypatch.setattr(beneath, "USE_OPENAT2", False)
    return str(request.param)


@dataclass
class Arena:
    ws: Path
    outside: Path
    inside: int  # a descriptor of the real `ws/d`, opened before the racing starts


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    """`ws/d` with files of its own, `ws/l` -> `outside`, which holds the same names with secret content."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    for folder, text in ((ws / "d", "inside"), (outside, SECRET)):
        folder.mkdir(parents=True)
        for name in ("secret.txt", "victim.txt"):
            (folder / name).write_text(text)
    (outside / MARKER).write_text(SECRET)
    (ws / "l").symlink_to(outside)
    inside = os.open(ws / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield Arena(Path(os.path.realpath(ws)), Path(os.path.realpath(outside)), inside)
    finally:
        os.close(inside)


@pytest.fixture
def racer(arena: Arena) -> Iterator[None]:
    ws = arena.ws
    process = subprocess.Popen(
        [sys.executable, "-c", RACER, str(ws / "d"), str(ws / "l")], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "racing":
        process.kill()
        process.wait()
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    try:
        yield
    finally:
        process.kill()
        process.wait()


def outside_entries(outside: Path) -> list[str]:
    return sorted(str(path.relative_to(outside)) for path in outside.rglob("*"))


async def attempt(coroutine: Awaitable[object]) -> str:
    """A tool's answer, or its error text: refusals are fine here, only escapes count."""
    try:
        return str(await coroutine)
    except ToolFailure as failure:
        return str(failure)


def refill(inside: int) -> None:
    """Put back what a round deleted or moved away, through a descriptor of the real directory: never by name."""
    for name in ("secret.txt", "victim.txt"):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=inside)
        os.write(fd, b"inside")
        os.close(fd)


async def test_no_file_tool_reaches_outside_while_a_directory_and_a_symlink_are_swapped(
    resolution: str, arena: Arena, racer: None
) -> None:
    ws, outside = arena.ws, arena.outside
    files = Files(ws)
    deadline = time.monotonic() + RACE_SECONDS
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        results = [
            await attempt(files.write_file("d/planted.txt", "owned")),
            await attempt(files.read_file("d/secret.txt", None, None, 65536)),
            await attempt(files.mkdir("d/made")),
            await attempt(files.delete_file("d/victim.txt")),
            await attempt(files.move("d/secret.txt", "stolen.txt")),
            await attempt(files.list_dir("d", True)),
            await attempt(files.list_dir("d", False)),
        ]
        assert not any(SECRET in text or MARKER in text for text in results), (rounds, results)
        assert outside_entries(outside) == OUTSIDE_ENTRIES, f"round {rounds}: changed outside"
        assert all((outside / name).read_text() == SECRET for name in OUTSIDE_ENTRIES), f"round {rounds}"
        stolen = ws / "stolen.txt"
        if stolen.exists():
            assert stolen.read_text() == "inside", f"round {rounds}: moved an outside file in"
        refill(arena.inside)
    assert rounds > 10
