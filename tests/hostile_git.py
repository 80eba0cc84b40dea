"""Hostile repositories, built in the test: each names a program (`payload.sh`, which creates a marker file) in
one of the ways git would run it by itself: config, attributes, hooks, a nested bare repository.

`build(root, vector, env)` makes, under `root`: `repo/` (a clone of `remote.git/`, one commit, an unstaged change,
a remote commit that conflicts with the next local one), `remote.git/`, `payload.sh` and, once it ran, `PWNED`.
`calls(hostile)` is the order the tests call the tools in: the read-only ones, then the ones that write.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

READ_TOOLS = ("git_status", "git_diff", "git_log", "git_branch")


@dataclass
class Hostile:
    root: Path
    env: dict[str, str]
    path: str = "repo"  # the `path` the tools are called with, relative to `root`
    remote: str = "origin"
    http_url: str | None = None  # a server that answers 401, for the credential vectors

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def bare(self) -> Path:
        return self.root / "remote.git"

    @property
    def marker(self) -> Path:
        return self.root / "PWNED"

    @property
    def payload(self) -> Path:
        return self.root / "payload.sh"

    def git(self, cwd: Path, *args: str) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, env=self.env, capture_output=True, text=True, check=True)
        return done.stdout

    def config(self, *pairs: tuple[str, str], where: Path | None = None) -> None:
        config = where or self.repo / ".git" / "config"
        for key, value in pairs:
            self.git(self.root, "config", "--file", str(config), "--add", key, value)

    def attributes(self, line: str) -> None:
        (self.repo / ".gitattributes").write_text(line + "\n")
        self.git(self.repo, "add", ".gitattributes")
        self.git(self.repo, "commit", "-q", "-m", "Attributes")
        (self.repo / "a.txt").write_text("local change\n")

    def hooks(self, directory: Path, names: tuple[str, ...]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in names:
            hook = directory / name
            hook.write_text(f"#!/bin/sh\ntouch {self.marker}\n")
            hook.chmod(0o755)


ALL_HOOKS = (
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-checkout",
    "pre-push",
    "post-merge",
    "pre-merge-commit",
    "reference-transaction",
    "pre-auto-gc",
    "post-index-change",
    "post-rewrite",
)
REMOTE_HOOKS = ("pre-receive", "update", "post-receive", "post-update", "reference-transaction", "push-to-checkout")


def _nested_bare(h: Hostile) -> Path:
    """`repo/vendor/x.git`: a bare repository inside the working tree, with a commit carrying a gpgsig header."""
    nested = h.repo / "vendor" / "x.git"
    h.git(h.root, "clone", "-q", "--bare", str(h.bare), str(nested))
    raw = h.git(nested, "cat-file", "commit", "main")
    header, _, message = raw.partition("\n\n")
    signature = "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----"
    signed = f"{header}\n{signature}\n\n{message}"
    forged = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
        cwd=nested,
        env=h.env,
        input=signed,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    h.git(nested, "update-ref", "refs/heads/main", forged)
    (nested / "payload.sh").write_text(h.payload.read_text())
    (nested / "payload.sh").chmod(0o755)
    return nested


def nested_bare_gpg(h: Hostile) -> None:
    nested = _nested_bare(h)
    h.config(("gpg.program", "./payload.sh"), ("log.showSignature", "true"), where=nested / "config")
    h.path = "repo/vendor/x.git"


def nested_bare_worktree_fsmonitor(h: Hostile) -> None:
    nested = _nested_bare(h)
    config = nested / "config"
    h.git(h.root, "config", "--file", str(config), "core.bare", "false")
    h.config(("core.worktree", str(h.repo)), ("core.fsmonitor", str(h.payload)), where=config)
    h.path = "repo/vendor/x.git"


def fsmonitor(h: Hostile) -> None:
    h.config(("core.fsmonitor", str(h.payload)))


def fsmonitor_by_include(h: Hostile) -> None:
    included = h.root / "included.cfg"
    included.write_text(f"[core]\n\tfsmonitor = {h.payload}\n")
    h.config(("include.path", str(included)))


def diff_external(h: Hostile) -> None:
    h.config(("diff.external", str(h.payload)))


def textconv(h: Hostile) -> None:
    h.attributes("* diff=evil")
    h.config(("diff.evil.textconv", str(h.payload)), ("diff.evil.command", str(h.payload)))


def filter_clean_smudge(h: Hostile) -> None:
    h.attributes("*.txt filter=evil")
    h.config(("filter.evil.clean", str(h.payload)), ("filter.evil.smudge", str(h.payload)))
    h.config(("filter.evil.required", "true"))


def filter_process(h: Hostile) -> None:
    h.attributes("*.txt filter=evil")
    h.config(("filter.evil.process", str(h.payload)))


def hooks(h: Hostile) -> None:
    h.hooks(h.repo / ".git" / "hooks", ALL_HOOKS)


def hooks_path(h: Hostile) -> None:
    h.hooks(h.repo / ".githooks", ALL_HOOKS)
    h.config(("core.hooksPath", ".githooks"))


def remote_hooks(h: Hostile) -> None:
    h.hooks(h.bare / "hooks", REMOTE_HOOKS)


def push_instead_of(h: Hostile) -> None:
    """The remote is given as a URL, which the repository's config rewrites to a local repository with hooks."""
    h.hooks(h.bare / "hooks", REMOTE_HOOKS)
    h.remote = "https://sandstorm.invalid/x.git"
    h.config(("url.file://" + str(h.bare) + ".pushInsteadOf", h.remote))
    h.config(("url." + str(h.bare) + ".insteadOf", h.remote))


def ssh_command(h: Hostile) -> None:
    h.config(("core.sshCommand", str(h.payload)))
    h.git(h.repo, "remote", "set-url", "origin", "ssh://git@sandstorm.invalid/x.git")


def git_proxy(h: Hostile) -> None:
    h.config(("core.gitProxy", str(h.payload)))
    h.git(h.repo, "remote", "set-url", "origin", "git://sandstorm.invalid/x.git")


def pack_programs(h: Hostile) -> None:
    h.config(("remote.origin.uploadpack", str(h.payload)), ("remote.origin.receivepack", str(h.payload)))


def credential_helper(h: Hostile) -> None:
    assert h.http_url
    h.config(("credential.helper", f"!{h.payload}"), (f"credential.{h.http_url}.helper", f"!{h.payload}"))
    h.git(h.repo, "remote", "set-url", "origin", h.http_url)


def askpass(h: Hostile) -> None:
    assert h.http_url
    h.config(("core.askPass", str(h.payload)))
    h.git(h.repo, "remote", "set-url", "origin", h.http_url)


def merge_driver(h: Hostile) -> None:
    h.attributes("*.txt merge=evil")
    h.config(("merge.evil.driver", f"{h.payload} %O %A %B"))


def gpg_signing(h: Hostile) -> None:
    h.config(("gpg.program", str(h.payload)), ("commit.gpgSign", "true"), ("gpg.format", "openpgp"))


def alternate_refs(h: Hostile) -> None:
    alternates = h.repo / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(str(h.bare / "objects") + "\n")
    h.config(("core.alternateRefsCommand", str(h.payload)))


def _populated_submodule(h: Hostile) -> Path:
    """`repo/sub`: a repository of its own whose config names a clean filter for every file, recorded in `repo`'s
    index as a gitlink (no `.gitmodules` needed). Its file's mtime is old, so any `git status` there would clean it."""
    sub = h.repo / "sub"
    h.git(h.repo, "init", "-q", "-b", "main", "sub")
    h.config(("filter.evil.clean", str(h.payload)), where=sub / ".git" / "config")
    (sub / ".gitattributes").write_text("* filter=evil\n")
    (sub / "f.txt").write_text("data\n")
    h.git(sub, "add", "-A")
    h.git(sub, "commit", "-q", "-m", "Submodule")
    os.utime(sub / "f.txt", (1_000_000_000, 1_000_000_000))
    h.marker.unlink(missing_ok=True)  # the filter ran for our own commit above
    head = h.git(sub, "rev-parse", "HEAD").strip()
    h.git(h.repo, "update-index", "--add", "--cacheinfo", f"160000,{head},sub")
    return sub


def submodule_filter(h: Hostile) -> None:
    _populated_submodule(h)


def submodule_filter_not_ignored(h: Hostile) -> None:
    """The same, with a committed `.gitmodules` whose `ignore = none` beats a `diff.ignoreSubmodules` setting."""
    _populated_submodule(h)
    (h.repo / ".gitmodules").write_text('[submodule "s"]\n\tpath = sub\n\turl = ./sub\n\tignore = none\n')
    h.git(h.repo, "add", ".gitmodules")
    h.git(h.repo, "commit", "-q", "-m", "Submodule")
    h.marker.unlink(missing_ok=True)


def ext_protocol(h: Hostile) -> None:
    h.config(("protocol.ext.allow", "always"), ("protocol.allow", "always"))
    h.git(h.repo, "remote", "set-url", "origin", f"ext::sh -c touch% {h.marker}")


VECTORS: dict[str, Callable[[Hostile], None]] = {
    function.__name__.replace("_", "-"): function
    for function in (
        nested_bare_gpg,
        nested_bare_worktree_fsmonitor,
        fsmonitor,
        fsmonitor_by_include,
        diff_external,
        textconv,
        filter_clean_smudge,
        filter_process,
        hooks,
        hooks_path,
        remote_hooks,
        push_instead_of,
        ssh_command,
        git_proxy,
        pack_programs,
        credential_helper,
        askpass,
        merge_driver,
        gpg_signing,
        alternate_refs,
        submodule_filter,
        submodule_filter_not_ignored,
        ext_protocol,
    )
}

# The vectors a read-only tool (status, diff, log, branch list) reaches; the others need a write tool.
READ_REACHABLE = (
    "nested-bare-gpg",
    "nested-bare-worktree-fsmonitor",
    "fsmonitor",
    "fsmonitor-by-include",
    "diff-external",
    "textconv",
    "filter-clean-smudge",
    "filter-process",
    "hooks",
    "hooks-path",  # post-index-change on status
    "submodule-filter",
    "submodule-filter-not-ignored",
)


def build(root: Path, vector: str, env: dict[str, str], http_url: str | None = None) -> Hostile:
    root.mkdir(parents=True, exist_ok=True)
    h = Hostile(root=root, env=env, http_url=http_url)
    h.payload.write_text(f"#!/bin/sh\ntouch {h.marker}\ncat\n")  # cat: a filter that worked, for clean/smudge
    h.payload.chmod(0o755)
    seed = root / "seed"
    h.git(root, "init", "-q", "-b", "main", str(seed))
    (seed / "README.md").write_text("seed\n")
    (seed / "a.txt").write_text("base\n")
    h.git(seed, "add", "-A")
    h.git(seed, "commit", "-q", "-m", "Initial commit")
    h.git(root, "clone", "-q", "--bare", str(seed), str(h.bare))
    h.git(root, "clone", "-q", str(h.bare), str(h.repo))
    (seed / "a.txt").write_text("remote change\n")  # conflicts with the local one, for merge drivers
    h.git(seed, "commit", "-q", "-am", "Remote change")
    h.git(seed, "push", "-q", str(h.bare), "main")
    (h.repo / "a.txt").write_text("local change\n")
    h.git(h.repo, "config", "pull.rebase", "false")  # git 2.39 refuses to pull divergent branches without it
    VECTORS[vector](h)
    return h


@contextlib.contextmanager
def unauthorized_http() -> Iterator[str]:
    """A git URL on a local HTTP server that answers every request with 401, so git asks for credentials."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/x.git"
    finally:
        server.shutdown()
        server.server_close()


def calls(h: Hostile, *, writes: bool) -> list[tuple[str, dict[str, object]]]:
    """The tool calls to make against `h` (paths relative to the workspace are made by the caller)."""
    read: list[tuple[str, dict[str, object]]] = [
        ("git_status", {}),
        ("git_diff", {}),
        ("git_log", {"n": 5}),
        ("git_branch", {}),
    ]
    if not writes:
        return read
    return read + [
        ("git_branch", {"name": "feature"}),
        ("git_commit", {"message": "Change a"}),
        ("git_checkout", {"branch": "feature"}),
        ("git_checkout", {"branch": "main"}),
        ("git_push", {"remote": h.remote, "branch": "feature"}),
        ("git_pull", {"remote": h.remote, "branch": "main"}),
        ("git_push", {"remote": h.remote, "branch": "main"}),
    ]
