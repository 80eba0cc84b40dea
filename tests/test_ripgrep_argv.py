"""file_grep's and file_glob's ripgrep command lines: what an agent gives is a value, never an option."""

from __future__ import annotations

import pytest

from mcpserver.executor import ripgrep
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.ripgrep import GrepQuery, grep_argv

KNOWN = frozenset({"py", "js", "rust"})


def test_a_pattern_that_looks_like_an_option_stays_the_pattern() -> None:
    argv = grep_argv("rg", GrepQuery("-rf /"), KNOWN)
    assert argv[-4:] == ["--regexp", "-rf /", "--", "."]
    assert "--no-config" in argv and "--hidden" in argv


@pytest.mark.parametrize("glob", ["/etc/*", "../*", "a/../../b", "!../x", "", "a\x00b"])
def test_globs_out_of_the_searched_directory_are_refused(glob: str) -> None:
    with pytest.raises(ToolFailure, match="glob"):
        grep_argv("rg", GrepQuery("x", glob=glob), KNOWN)
    with pytest.raises(ToolFailure, match="glob"):
        ripgrep.glob_argv("rg", glob)


def test_the_agents_glob_comes_before_the_skipped_directories() -> None:
    argv = grep_argv("rg", GrepQuery("x", glob="!*.min.js"), KNOWN)
    globs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--glob"]
    assert globs == ["!*.min.js", "!.git/", "!.sandstorm/"]  # the last matching glob wins in rg


@pytest.mark.parametrize("name", ["nosuch", "--pre=sh", "py;rm", "p y"])
def test_unknown_or_odd_types_are_refused(name: str) -> None:
    with pytest.raises(ToolFailure, match="unknown file type"):
        grep_argv("rg", GrepQuery("x", type=name), KNOWN)


def test_modes_and_options() -> None:
    content = grep_argv("rg", GrepQuery("x", "content", context_before=2, context_after=3, case_insensitive=True,
                                        multiline=True, line_numbers=False), KNOWN)  # fmt: skip
    for part in ("--no-line-number", "--ignore-case", "--multiline", "--multiline-dotall", "--max-columns"):
        assert part in content
    assert content[content.index("--before-context") + 1] == "2"
    assert content[content.index("--after-context") + 1] == "3"
    assert "--files-with-matches" in grep_argv("rg", GrepQuery("x"), KNOWN)
    assert "--count-matches" in grep_argv("rg", GrepQuery("x", "count"), KNOWN)
    with pytest.raises(ToolFailure, match="output_mode"):
        grep_argv("rg", GrepQuery("x", "everything"), KNOWN)
    with pytest.raises(ToolFailure, match="context_after must be between 0 and 100"):
        grep_argv("rg", GrepQuery("x", "content", context_after=1000), KNOWN)
    with pytest.raises(ToolFailure, match="pattern is empty"):
        grep_argv("rg", GrepQuery(""), KNOWN)


def test_type_names_come_from_rgs_list() -> None:
    assert ripgrep.type_names("py: *.py, *.pyi\nrust: *.rs\n") == {"py", "rust"}
    assert ripgrep.relative("./a/b.py:3:x") == "a/b.py:3:x" and ripgrep.relative("--") == "--"
