"""Globs and paths for policy rules, decided lexically: the engine never touches the file system.

Globs are fnmatch-like, with one difference that matters for paths: `*` and `?` stay within one path segment and
`**` crosses `/` (`a/**` is `a` and everything below it, `**/x` is `x` in any directory). `[abc]` and `[!abc]`
are character classes. `*` matches a leading dot too: a rule names dot-files on purpose (`~/.*`).

A path glob is anchored by its first character: `~` is the agent's home directory, `/` the file system's root, and
anything else is relative to the workspace. Paths are compared after `~` is expanded and `.`/`..` are collapsed
(`posixpath.normpath`), never after resolving symlinks: a rule is a guardrail against mistakes, not a boundary.
A path's `~name` is that user's home from the password database (the one lookup outside the arguments), so
`~root/.bashrc` is `/root/.bashrc`; a `~name` naming no user, and `~+`/`~-`, cannot be known here (`unknown_tilde`).
"""

from __future__ import annotations

import functools
import posixpath
import pwd
import re
from collections.abc import Collection
from dataclasses import dataclass, field


@functools.lru_cache(maxsize=512)
def glob_regex(glob: str) -> re.Pattern[str]:
    """The compiled regular expression of `glob`, to be used with `fullmatch`."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        char = glob[i]
        if glob.startswith("**", i):
            at_start = i == 0 or glob[i - 1] == "/"
            end = i + 2
            while end < n and glob[end] == "*":
                end += 1
            if at_start and glob.startswith("/", end):
                out.append("(?:.*/)?")  # `**/` also matches no directory at all
                end += 1
            elif at_start and end == n and out and out[-1] == "/":
                out[-1] = "(?:/.*)?"  # a trailing `/**` includes the directory itself
            else:
                out.append(".*")
            i = end
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            close = _class_end(glob, i)
            if close < 0:
                out.append(re.escape(char))
            else:
                out.append(_char_class(glob[i + 1 : close]))
                i = close
        else:
            out.append(re.escape(char))
        i += 1
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error as error:  # a class such as `[z-a]`
        raise GlobError(f"{glob!r} is not a glob: {error.msg}") from error


class GlobError(ValueError):
    """A glob that cannot be read (a character class out of order)."""


def _class_end(glob: str, start: int) -> int:
    """The index of the `]` closing the class that opens at `start`, or -1 (then `[` is literal)."""
    i = start + 1
    if i < len(glob) and glob[i] in "!^":
        i += 1
    if i < len(glob) and glob[i] == "]":
        i += 1  # a `]` first in the class is a member
    return glob.find("]", i)


def _char_class(body: str) -> str:
    negated = body[:1] in ("!", "^")
    if negated:
        body = body[1:]
    escaped = body.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
    return f"[^/{escaped}]" if negated else f"[{escaped}]"


def normalise(path: str) -> str:
    """`path` (absolute) with `.`, `..` and repeated slashes collapsed, and no trailing slash."""
    collapsed = posixpath.normpath(path)
    return "/" + collapsed.lstrip("/") if collapsed.startswith("//") else collapsed


def expand_home(path: str, home: str) -> str | None:
    """`path` with a leading `~` replaced by `home`, and `~name` by that user's home; None when `~name` names no
    user (or is `~+`, `~-`, `~1`: directories only the running shell knows)."""
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    if path.startswith("~"):
        name, slash, rest = path[1:].partition("/")
        found = user_home(name)
        return None if found is None else (found.rstrip("/") or "/") + slash + rest
    return path


@functools.lru_cache(maxsize=256)
def user_home(name: str) -> str | None:
    """The home directory of user `name` in the password database, or None (no such user, or not a name)."""
    if not name or name[0] in "+-" or name.isdigit():
        return None
    try:
        return pwd.getpwnam(name).pw_dir or None
    except (KeyError, ValueError):  # no such user; a NUL in the name
        return None


def unknown_tilde(word: str) -> str | None:
    """The `~name` prefix of `word` (or of the value of a `KEY=` word, which bash expands too) when its directory
    cannot be known here, else None."""
    key, equals, value = word.partition("=")
    for text in (word, value) if equals and key.isidentifier() else (word,):
        if text.startswith("~") and expand_home(text, "/") is None:
            return text.partition("/")[0]
    return None


def resolve(path: str, base: str, home: str) -> str | None:
    """The absolute, normalised path that `path` names when relative to `base`; None if it cannot be known here."""
    expanded = expand_home(path, home)
    if expanded is None:
        return None
    return normalise(expanded if expanded.startswith("/") else f"{base}/{expanded}")


def below(path: str, root: str) -> bool:
    """Whether `path` is `root` or inside it (both normalised)."""
    return path == root or path.startswith(root + "/") or root == "/"


@dataclass(frozen=True)
class PathGlob:
    """A glob over normalised absolute paths, anchored at the home directory, the root or the workspace."""

    text: str
    anchor: str = field(init=False)  # "home", "root" or "workspace"
    tail: re.Pattern[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        text = self.text
        if text == "~" or text.startswith("~/"):
            anchor, tail = "home", text[2:]
        elif text.startswith("/"):
            anchor, tail = "root", text
        else:
            anchor, tail = "workspace", text[2:] if text.startswith("./") else text
        object.__setattr__(self, "anchor", anchor)
        object.__setattr__(self, "tail", glob_regex(tail))

    def matches(self, path: str, places: Places) -> bool:
        """Whether the normalised absolute `path` matches, its anchor taken from `places`."""
        if self.anchor == "root":
            return self.tail.fullmatch(path) is not None
        base = places.home if self.anchor == "home" else places.workspace
        if path == base:
            rest = ""
        elif path.startswith(base + "/") or base == "/":
            rest = path[len(base) :].lstrip("/")
        else:
            return False
        return self.tail.fullmatch(rest) is not None


@dataclass(frozen=True)
class Places:
    """Where one call happens: the workspace, the agent's home, the git repositories and the starting directory.

    All absolute and normalised. `git_roots` are the repositories the caller knows of under the workspace.
    """

    workspace: str
    home: str
    git_roots: Collection[str] = ()
    cwd: str = ""

    def in_repository(self, path: str) -> bool:
        """Whether `path` lies strictly inside a known git repository (the repository's own root is not: removing
        a whole repository is worth a question)."""
        return any(path.startswith(root.rstrip("/") + "/") for root in self.git_roots)

    def in_workspace(self, path: str) -> bool:
        return below(path, self.workspace)

    def resolve(self, path: str, base: str | None = None) -> str | None:
        """`path` as an absolute normalised path, relative to `base` (default: the workspace)."""
        return resolve(path, base or self.workspace, self.home)
