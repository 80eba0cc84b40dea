"""Which repository a git tool works on: only the usual layouts, found in-process without running git.

A cloned repository may carry other repositories inside it (`vendor/x.git/`, a bare repository with its own
config). git's own discovery would walk into them, and their config may relocate the working tree
(`core.bare=false` + `core.worktree`). So the repository is chosen here and then handed to git explicitly
(`GIT_DIR`, `GIT_WORK_TREE`), which turns git's discovery and any relocation off:

- `<dir>/.git` (a directory, or a `gitdir:` file as linked worktrees and submodules have) in the named directory
  or one of its parents up to the workspace root: the working tree is `<dir>`;
- a bare repository, only when it is the very directory named.

Every directory git would use (working tree, git directory, common directory) must be in the workspace, and so
must every object store it reads: the objects directory (and what a symlink among its entries leads to) and each
alternate that `objects/info/alternates` names, followed as git follows them. A repository borrowing objects from
outside would let `git_log`/`git_diff` print another repository's commits and files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.paths import Workspace

GITFILE_PREFIX = "gitdir: "
MAX_GITFILE_BYTES = 4096
MAX_ALTERNATES_BYTES = 1 << 20
ALTERNATES_DEPTH = 5  # git follows alternates of alternates this deep (object-file.c)
C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}


@dataclass(frozen=True)
class Layout:
    """`git_dir` and `common_dir` (they differ in a linked worktree); `work_tree` is None for a bare repository."""

    git_dir: Path
    common_dir: Path
    work_tree: Path | None

    @property
    def linked(self) -> bool:
        """A linked worktree or a gitfile's target with a `commondir`: git takes no core.worktree from it."""
        return self.common_dir != self.git_dir


def looks_like_git_dir(path: Path) -> bool:
    """git's own test (setup.c `is_git_directory`): `HEAD`, an `objects` and a `refs` directory (or a commondir)."""
    if not (path / "HEAD").is_file():
        return False
    common = _common_dir(path)
    return (common / "objects").is_dir() and (common / "refs").is_dir()


def _common_dir(git_dir: Path) -> Path:
    try:
        text = (git_dir / "commondir").read_text(encoding="utf-8", errors="strict").strip()
    except (FileNotFoundError, NotADirectoryError):
        return git_dir
    except (OSError, UnicodeDecodeError):
        return git_dir / "commondir"  # unreadable: a path that fails the checks below
    return Path(os.path.realpath(git_dir / text))


def _gitfile_target(gitfile: Path) -> Path | None:
    """The directory a `.git` file names (`gitdir: <path>`, relative to the file's directory), or None."""
    try:
        with gitfile.open("rb") as handle:
            raw = handle.read(MAX_GITFILE_BYTES)
        first = raw.decode("utf-8").splitlines()[0] if raw else ""
    except (OSError, UnicodeDecodeError):
        return None
    if not first.startswith(GITFILE_PREFIX):
        return None
    return Path(os.path.realpath(gitfile.parent / first[len(GITFILE_PREFIX) :].strip()))


def _usual_layout(directory: Path) -> Layout | None:
    dotgit = directory / ".git"
    if dotgit.is_symlink():
        git_dir: Path | None = Path(os.path.realpath(dotgit))
    elif dotgit.is_dir():
        git_dir = dotgit
    elif dotgit.is_file():
        git_dir = _gitfile_target(dotgit)
    else:
        return None
    if git_dir is None or not looks_like_git_dir(git_dir):
        return None
    return Layout(git_dir=git_dir, common_dir=_common_dir(git_dir), work_tree=directory)


def find_layout(workspace: Workspace, real: Path) -> Layout:
    """The repository `real` (a real, existing directory in the workspace) belongs to, in a usual layout."""
    failure = ToolFailure(f"Error: {real} is not a git repository")
    layout: Layout | None = None
    for directory in (real, *real.parents):
        if not workspace.contains(directory):
            break
        layout = _usual_layout(directory)
        if layout is not None:
            break
        if directory == real and real.name != ".git" and looks_like_git_dir(real):
            layout = Layout(git_dir=real, common_dir=_common_dir(real), work_tree=None)
            break
    if layout is None:
        raise failure
    places = [layout.git_dir, layout.common_dir] + ([layout.work_tree] if layout.work_tree else [])
    if not all(workspace.contains(Path(os.path.realpath(place))) for place in places):
        raise failure
    reach = outside_object_store(workspace, layout.common_dir / "objects")
    if reach is not None:
        raise ToolFailure(
            f"Error: {real} is refused: its repository reads objects from outside the workspace ({reach}); the "
            "git tools read only repositories whose objects are all in the workspace"
        )
    return layout


def outside_object_store(workspace: Workspace, objects: Path, depth: int = 0) -> str | None:
    """How the object store at `objects` (or an alternate of it) reaches outside the workspace, or None."""
    real = Path(os.path.realpath(objects))
    if not workspace.contains(real):
        return f"{objects} is {real}"
    for directory in (real, real / "pack"):
        for entry in _symlinks(directory):
            target = Path(os.path.realpath(entry))
            if not workspace.contains(target):
                return f"{entry} leads to {target}"
    if _entries(real / "info" / "http-alternates"):
        return f"{real / 'info' / 'http-alternates'} names other repositories"
    for name in _entries(real / "info" / "alternates"):
        alternate = Path(os.path.realpath(real / name))
        if not workspace.contains(alternate):
            return f"{real / 'info' / 'alternates'} names {name}"
        if depth < ALTERNATES_DEPTH:
            reach = outside_object_store(workspace, alternate, depth + 1)
            if reach is not None:
                return reach
    return None


def _symlinks(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as entries:
            return [Path(entry.path) for entry in entries if entry.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _entries(path: Path) -> list[str]:
    """The paths an alternates file names, as git reads them (`#` comments; a `"` line may be C-quoted).

    A quoted line is checked both as git unquotes it and as written, so a spelling we read differently from git
    errs towards refusing. An unreadable file is reported as naming itself, which is refused.
    """
    try:
        with path.open("rb") as handle:
            text = handle.read(MAX_ALTERNATES_BYTES).decode("utf-8", errors="surrogateescape")
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        return ["/" + str(path)]
    names: list[str] = []
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        names.append(line)
        unquoted = _c_unquoted(line) if line.startswith('"') else None
        names += [unquoted] if unquoted is not None else []
    return names


def _c_unquoted(line: str) -> str | None:
    """git's `unquote_c_style`: the text inside the quotes, with C escapes and octal bytes; None when malformed."""
    out, index = bytearray(), 1
    while index < len(line):
        char = line[index]
        if char == '"':
            return out.decode("utf-8", errors="surrogateescape")
        if char != "\\":
            out += char.encode("utf-8", errors="surrogateescape")
            index += 1
            continue
        following = line[index + 1 : index + 2]
        if following in C_ESCAPES:
            out += C_ESCAPES[following].encode()
            index += 2
        elif len(line) >= index + 4 and all(c in "01234567" for c in line[index + 1 : index + 4]):
            out.append(int(line[index + 1 : index + 4], 8) & 0xFF)
            index += 4
        else:
            return None
    return None


def configured_work_tree(layout: Layout, value: str) -> Path:
    """Where git would put the working tree for `core.worktree = value`: relative to the git directory."""
    return Path(os.path.realpath(layout.git_dir / value))
