"""Checks on the values agents hand to the git tools, so that none reaches git as an option or a remote helper.

These are the checks that need no repository. Branch names are further checked by `git check-ref-format`, and
push/pull remotes against the repository's own remotes, in `git.py`.
"""

from __future__ import annotations

import re

from mcpserver.executor.interface import ToolFailure

# git's own test for the `<transport>::<address>` form (transport.c): a run of these characters, then "::".
# Such a URL makes git run `git-remote-<transport>`; `ext::` runs any command.
REMOTE_HELPER_FORM = re.compile(r"[A-Za-z0-9+.-]*::")


def refuse_option_like(kind: str, value: str) -> None:
    """Refuse a value git could read as an option, whatever position it is given in."""
    if value.startswith("-"):
        raise ToolFailure(f"Error: invalid {kind} '{value}': it must not start with '-'")


def refuse_control_characters(kind: str, value: str) -> None:
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise ToolFailure(f"Error: invalid {kind} {value!r}: it must not contain control characters")


def check_branch_syntax(value: str, kind: str = "branch name") -> None:
    """The checks on a branch name that come before `git check-ref-format --branch`."""
    if not value:
        raise ToolFailure(f"Error: invalid {kind} '': it must not be empty")
    refuse_option_like(kind, value)
    refuse_control_characters(kind, value)


def check_refspec_branch(value: str) -> None:
    """A branch given to push or pull, where a leading '+' would turn it into a forced update."""
    check_branch_syntax(value)
    if value.startswith("+"):
        raise ToolFailure(f"Error: invalid branch name '{value}': it must not start with '+' (a forced update)")


def check_remote_name(value: str) -> None:
    if not value:
        raise ToolFailure("Error: invalid remote name '': it must not be empty")
    refuse_option_like("remote name", value)
    refuse_control_characters("remote name", value)


def check_repository_url(url: str) -> None:
    """A URL (or path) git may fetch from or push to: never an option, never a remote-helper form."""
    if not url.strip():
        raise ToolFailure("Error: invalid repository URL '': it must not be empty")
    refuse_option_like("repository URL", url)
    refuse_control_characters("repository URL", url)
    if REMOTE_HELPER_FORM.match(url):
        raise ToolFailure(
            f"Error: invalid repository URL '{url}': the '<transport>::<address>' form runs a remote helper "
            "and is not allowed; use a file, git, http(s) or ssh URL"
        )


def looks_like_url(value: str) -> bool:
    """Whether git would take `value` as a URL or path rather than as the name of a remote."""
    return "/" in value or ":" in value


def is_local_url(url: str) -> bool:
    """Whether git reaches `url` on this machine (connect.c's `url_is_local_not_ssh`, or `file://`)."""
    if url.startswith("file://"):
        return True
    if "://" in url:
        return False
    colon, slash = url.find(":"), url.find("/")
    return colon < 0 or 0 <= slash < colon


def directory_name_from_url(url: str) -> str:
    """The directory `git clone` would create for `url`: its last path component without `.git`."""
    stripped = url.rstrip("/")
    stripped = stripped.removesuffix("/.git").rstrip("/")
    name = re.split(r"[/:]", stripped)[-1].removesuffix(".git")
    if name in ("", ".", ".."):
        raise ToolFailure(f"Error: cannot derive a directory name from '{url}'; pass `path`")
    return name
