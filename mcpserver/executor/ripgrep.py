"""ripgrep's command lines for file_grep and file_glob, and the checks on what an agent may put in them.

Everything an agent gives goes in as a value, never as an option: the pattern after `-e`, globs after `--glob`,
types after `--type` (a name checked against rg's own list). rg reads no config file (`--no-config`), follows no
symlink (it never does without `-L`; the directory it searches is opened beneath the workspace before it starts),
and skips `.git` and the server's own `.sandstorm`, while `.gitignore` rules apply as rg applies them.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from mcpserver.executor.interface import ToolFailure

OUTPUT_MODES = ("content", "files_with_matches", "count")
MAX_CONTEXT = 100
MAX_COLUMNS = 1000  # a longer line (minified code, data) is shown as a preview, not whole
TYPE_NAME = re.compile(r"^[A-Za-z0-9_+-]{1,40}$")
# Hidden files are searched (agents look for .github/, .env.example, ...); these never are.
ALWAYS_SKIPPED = ("!.git/", "!.sandstorm/")
BASE_OPTIONS = ("--no-config", "--color", "never", "--hidden", "--no-messages")


def rg_binary() -> str | None:
    """The `rg` installed beside this Python (the ripgrep package puts it in the virtualenv's bin), else PATH's."""
    beside = Path(sys.executable).parent / "rg"
    if beside.is_file():
        return str(beside)
    return shutil.which("rg")


def check_glob(glob: str) -> str:
    """A glob relative to the searched directory: not absolute, no `..` component, no NUL. A leading `!` excludes."""
    body = glob[1:] if glob.startswith("!") else glob
    if not body or "\x00" in body:
        raise ToolFailure(f"Error: glob {glob!r} is empty or contains a NUL byte")
    if body.startswith("/") or ".." in body.split("/"):
        raise ToolFailure(f"Error: glob {glob!r} must be relative to path and may not contain '..'")
    return glob


def check_type(name: str, known: frozenset[str]) -> str:
    if not TYPE_NAME.match(name) or name not in known:
        raise ToolFailure(f"Error: unknown file type {name!r}: use a ripgrep type such as py, js, rust, go, md")
    return name


def _count(name: str, value: int | None, low: int, high: int) -> int | None:
    if value is None:
        return None
    if not low <= value <= high:
        raise ToolFailure(f"Error: {name} must be between {low} and {high}, not {value}")
    return value


@dataclass(frozen=True)
class GrepQuery:
    pattern: str
    output_mode: str = "files_with_matches"
    glob: str | None = None
    type: str | None = None
    case_insensitive: bool = False
    line_numbers: bool = True
    context_before: int | None = None
    context_after: int | None = None
    multiline: bool = False


def grep_argv(rg: str, query: GrepQuery, known_types: frozenset[str]) -> list[str]:
    """rg's argv for `query`, searching the current directory (the caller runs it in the searched directory)."""
    if query.output_mode not in OUTPUT_MODES:
        raise ToolFailure(f"Error: output_mode must be one of {', '.join(OUTPUT_MODES)}, not {query.output_mode!r}")
    if not query.pattern or "\x00" in query.pattern:
        raise ToolFailure("Error: pattern is empty or contains a NUL byte")
    argv = [rg, *BASE_OPTIONS, "--with-filename"]
    if query.output_mode == "files_with_matches":
        argv.append("--files-with-matches")
    elif query.output_mode == "count":
        argv.append("--count-matches")
    else:
        argv += ["--no-heading", "--max-columns", str(MAX_COLUMNS), "--max-columns-preview"]
        argv.append("--line-number" if query.line_numbers else "--no-line-number")
        before = _count("context_before", query.context_before, 0, MAX_CONTEXT)
        after = _count("context_after", query.context_after, 0, MAX_CONTEXT)
        if before:
            argv += ["--before-context", str(before)]
        if after:
            argv += ["--after-context", str(after)]
    if query.case_insensitive:
        argv.append("--ignore-case")
    if query.multiline:
        argv += ["--multiline", "--multiline-dotall"]
    if query.type is not None:
        argv += ["--type", check_type(query.type, known_types)]
    if query.glob is not None:
        argv += ["--glob", check_glob(query.glob)]
    for skipped in ALWAYS_SKIPPED:  # after the agent's globs: the last matching glob wins
        argv += ["--glob", skipped]
    return [*argv, "--regexp", query.pattern, "--", "."]


def glob_argv(rg: str, pattern: str) -> list[str]:
    argv = [rg, *BASE_OPTIONS, "--files", "--glob", check_glob(pattern)]
    for skipped in ALWAYS_SKIPPED:
        argv += ["--glob", skipped]
    return [*argv, "--", "."]


def type_names(type_list: str) -> frozenset[str]:
    """The names in `rg --type-list` output (`name: glob, glob`)."""
    return frozenset(line.split(":", 1)[0].strip() for line in type_list.splitlines() if ":" in line)


def relative(line: str) -> str:
    """A line of rg's output with the `./` it puts before every path (it was given `.`) taken off."""
    return line[2:] if line.startswith("./") else line
