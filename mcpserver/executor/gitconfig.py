"""The config every git command runs with, so that git never runs a program a repository names.

A repository's own config (`.git/config`, `config.worktree`, and whatever those include) can name programs git
runs on its own: `core.fsmonitor` on `status`, `gpg.program` on `log` with `log.showSignature`, filter drivers
on `status`/`add`/`checkout` (chosen by `.gitattributes`), diff drivers, merge drivers, `core.sshCommand`,
`remote.<name>.uploadpack`, credential helpers, hooks. Two layers turn them off:

- `FIXED_OVERRIDES`, on every command: settings that turn a program off whatever config says;
- `repository_overrides`, from the repository's config read with `git config --list --show-scope`: every
  program-naming key the repository's own scopes set is overridden, with the value the admin's own (system or
  global) config gives it when there is one, else with git's default or an empty (disabled) value.

Both go through `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/`GIT_CONFIG_VALUE_<n>` (git >= 2.31): command-scope
config, which wins over every file, and which the git processes git itself starts (`pull` runs `fetch` and
`merge`, a local push runs `receive-pack` in the remote) inherit.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Scopes the admin controls; the repository's are "local" and "worktree" (includes take their includer's scope).
TRUSTED_SCOPES = frozenset({"system", "global"})

FIXED_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    # Hooks are programs the repository carries (a nested bare repository's `hooks/` is plain tracked files), and
    # a local push's remote inherits this too: no git tool runs hooks. terminal_exec can, on purpose.
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", ":"),  # git's own "no editor" value
    ("sequence.editor", ":"),
    ("log.showSignature", "false"),
    ("protocol.ext.allow", "never"),
    ("safe.bareRepository", "explicit"),
    # Submodules have configs of their own, which are not read here: no tool recurses into them.
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("push.recurseSubmodules", "no"),
    # `git submodule summary` in each submodule, with that submodule's config.
    ("status.submoduleSummary", "false"),
    # A local push to a non-bare repository would check files out there, with that repository's filters.
    ("receive.denyCurrentBranch", "refuse"),
    # Run when a repository has alternates; `true` just advertises no extra tips.
    ("core.alternateRefsCommand", "true"),
)
# uploadpack.packObjectsHook needs no entry: git reads it from system, global and command config only.
# remote.<name>.uploadpack/receivepack need none either: the first value wins there, so `local_pack_program`
# replaces them on the command line, for the local transports where they would run here.

# git clears command-scope config for the git it starts in the other repository of a local transport
# (`receive-pack` on a push, `upload-pack` on a fetch), which then reads that repository's config alone.
REMOTE_SIDE_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.alternateRefsCommand", "true"),
    ("receive.denyCurrentBranch", "refuse"),
)

# Keys naming one program: the repository's value is replaced by the admin's, else by this one (git's default).
PROGRAM_KEYS: dict[str, str] = {
    "core.sshcommand": "ssh",
    "core.askpass": "",
    "gpg.program": "gpg",
    "gpg.openpgp.program": "gpg",
    "gpg.x509.program": "gpgsm",
    "gpg.ssh.program": "ssh-keygen",
    "gpg.ssh.defaultkeycommand": "",
}
# Keys with a subsection (`<section>.<name>.<key>`), the same way; an empty program is one git does not run.
PROGRAM_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"filter\..+\.(clean|smudge|process)"), ""),
    (re.compile(r"filter\..+\.required"), "false"),
    (re.compile(r"diff\..+\.(textconv|command)"), ""),
    (re.compile(r"merge\..+\.driver"), ""),
    (re.compile(r"remote\..+\.vcs"), ""),
    (re.compile(r"trailer\..+\.(command|cmd)"), ""),
)
CREDENTIAL_HELPER = re.compile(r"credential\.(.+\.)?helper")
FILTER_DRIVER = re.compile(r"filter\.(.+)\.(clean|smudge|process)")
MERGE_DRIVER = re.compile(r"merge\.(.+)\.driver")
GIT_PROXY = "core.gitproxy"
HOOKS_PATH = "core.hookspath"


@dataclass(frozen=True)
class ConfigEntry:
    scope: str
    key: str  # as git prints it: section and key lower-cased, subsection as written
    value: str


@dataclass(frozen=True)
class Overrides:
    """What to pass git for one repository, and what of the repository's own config it turns off."""

    pairs: tuple[tuple[str, str], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    skipped_filters: tuple[str, ...] = ()
    skipped_merge_drivers: tuple[str, ...] = ()
    work_tree: str | None = None  # the repository's core.worktree, if it sets one
    hooks_path: str | None = None  # core.hooksPath as configured (any scope but ours), for the skipped-hooks note

    def notes(self, *, filters: bool, merges: bool) -> list[str]:
        lines = []
        if filters and self.skipped_filters:
            lines.append(_skipped("filter driver", self.skipped_filters))
        if merges and self.skipped_merge_drivers:
            lines.append(_skipped("merge driver", self.skipped_merge_drivers))
        return lines


def _skipped(kind: str, names: Sequence[str]) -> str:
    listed = ", ".join(sorted(names))
    return (
        f"Note: this repository's own {kind}s were not run ({listed}): the git tools never run programs a "
        "repository's config names; run git with terminal_exec to use them."
    )


def parse_listing(output: str) -> list[ConfigEntry]:
    """`git config -z --show-scope --list`: `scope NUL key LF value NUL` per entry (no LF: a key without value)."""
    fields = output.split("\0")
    entries = []
    for scope, item in zip(fields[0::2], fields[1::2], strict=False):  # a trailing empty field has no pair
        key, _, value = item.partition("\n")
        entries.append(ConfigEntry(scope=scope, key=key, value=value))
    return entries


def _program_default(key: str) -> str | None:
    lowered = key.lower()
    if lowered in PROGRAM_KEYS:
        return PROGRAM_KEYS[lowered]
    for pattern, default in PROGRAM_PATTERNS:
        if pattern.fullmatch(key):
            return default
    return None


def repository_overrides(entries: Iterable[ConfigEntry], admin_env: dict[str, str]) -> Overrides:
    entries = list(entries)
    trusted = [entry for entry in entries if entry.scope in TRUSTED_SCOPES]
    own = [entry for entry in entries if entry.scope not in TRUSTED_SCOPES and entry.scope != "command"]
    admin_values = {entry.key: entry.value for entry in trusted}  # the last one wins, as in git
    pairs: list[tuple[str, str]] = []
    for key in dict.fromkeys(entry.key for entry in own):
        default = _program_default(key)
        if default is not None:
            pairs.append((key, admin_values.get(key, default)))
    if any(CREDENTIAL_HELPER.fullmatch(entry.key) for entry in own):
        # An empty helper clears the list so far; then the admin's helpers again, in their order.
        pairs.append(("credential.helper", ""))
        pairs += [(entry.key, entry.value) for entry in trusted if CREDENTIAL_HELPER.fullmatch(entry.key)]
    env: dict[str, str] = {}
    if any(entry.key == GIT_PROXY for entry in own) and "GIT_PROXY_COMMAND" not in admin_env:
        env["GIT_PROXY_COMMAND"] = ""  # core.gitProxy's first match wins, so only the variable can override it
    work_tree = next((entry.value for entry in reversed(own) if entry.key == "core.worktree"), None)
    return Overrides(
        pairs=tuple(pairs),
        env=env,
        skipped_filters=_names(own, FILTER_DRIVER, admin_values),
        skipped_merge_drivers=_names(own, MERGE_DRIVER, admin_values),
        work_tree=work_tree,
        hooks_path=next((e.value for e in reversed(entries) if e.key == HOOKS_PATH and e.scope != "command"), None),
    )


def _names(own: Iterable[ConfigEntry], pattern: re.Pattern[str], admin_values: dict[str, str]) -> tuple[str, ...]:
    """Drivers the repository defines that are not simply the admin's own (e.g. `git lfs install` in both)."""
    names = []
    for entry in own:
        match = pattern.fullmatch(entry.key)
        if match and entry.value and admin_values.get(entry.key) != entry.value:
            names.append(match.group(1))
    return tuple(dict.fromkeys(names))


def ignored_push_settings(entries: Iterable[ConfigEntry], remote: str) -> list[str]:
    """A note naming the settings of `remote` that would have widened a push (forced, deleted, mirrored), if any."""
    keys = (f"remote.{remote}.push", f"remote.{remote}.mirror")
    found = [f"{e.key} = {e.value}" for e in entries if e.scope != "command" and e.key in keys]
    if not found:
        return []
    return [
        f"Note: this repository's push settings were not used ({'; '.join(found)}): git_push pushes one branch to "
        "the branch of the same name and never forces, deletes or mirrors; run git with terminal_exec for that."
    ]


PUSH_REWRITE = re.compile(r"url\.(.+)\.pushinsteadof")


def push_rewrite(url: str, entries: Iterable[ConfigEntry]) -> str | None:
    """`url` after the longest matching `url.<base>.pushInsteadOf`, as git rewrites a URL it pushes to; or None."""
    best: tuple[int, str] | None = None
    for entry in entries:
        match = PUSH_REWRITE.fullmatch(entry.key)
        if match and entry.value and url.startswith(entry.value) and (best is None or len(entry.value) > best[0]):
            best = (len(entry.value), match.group(1) + url[len(entry.value) :])
    return None if best is None else best[1]


def config_environment(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for index, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def local_pack_program(command: str) -> str:
    """`git -c ... receive-pack` (or `upload-pack`): what git should run in a local remote, through its shell."""
    options = [part for key, value in REMOTE_SIDE_OVERRIDES for part in ("-c", f"{key}={value}")]
    return shlex.join(["git", *options, command])


def is_config_variable(name: str) -> bool:
    """Variables that carry command-scope config: only ours may reach git."""
    return name in ("GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS") or name.startswith(
        ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")
    )


# Commands that can print diffs: external diff programs and textconv drivers are turned off on the command line
# too (`--no-ext-diff` is git's documented switch for `diff.external` and `diff.<driver>.command`).
DIFF_COMMANDS = frozenset({"diff", "log", "show"})
DIFF_FLAGS = ("--no-ext-diff", "--no-textconv")


def command_argv(args: Sequence[str]) -> list[str]:
    """`git --no-pager <args>`, with the diff flags right after a diff-printing command's name."""
    argv = ["git", "--no-pager"]
    rest = list(args)
    for index, arg in enumerate(rest):
        if arg == "-c":
            continue
        if index > 0 and rest[index - 1] == "-c":
            continue
        if arg in DIFF_COMMANDS:
            rest[index + 1 : index + 1] = DIFF_FLAGS
        break
    return argv + rest
