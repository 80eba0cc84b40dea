"""The recommended rules an admin can switch on: ask before what is hard to undo, deny what takes the host down.

Kept as data (the JSON an admin would write) so that it can be shown, copied and edited. Deny rules come first,
although the order only matters within one command: each command of a call is decided on its own (evaluate.py).

- deny: making file systems (`mkfs`, `mkfs.*`, `mke2fs`, `mkswap`); `dd` writing to a block device, or a
  redirection, `tee`, or `cp`/`mv`/`install` (as the destination after a source) into one (not `/dev/null` and
  the like: block devices are listed by name); `shutdown`, `reboot`, `halt`, `poweroff`, `init 0|6`,
  `telinit 0|6`, `systemctl poweroff|reboot|halt|kexec`.
- ask: `rm -r` or `find -delete` of a path outside the workspace's git repositories; `rsync --delete` (and its
  `--delete-*` forms and `--remove-source-files`) anywhere, as its destination may be on another host; `git
  push` with `-f`, `--force`, `--force-with-lease`, a `+refspec`, `--mirror`, `--delete`/`-d`, `--prune` or a
  `:branch` that deletes it; `sudo`, `doas`, `su`, `pkexec`; `curl`/`wget` piped into a shell or an interpreter;
  `chmod -R`; writing to dot-files in the home: the file tools' paths `~/.*` and `~/.*/**`, and redirections to
  them, `tee`, `cp`, `mv`, `ln`, `install`, `sed -i`, `dd of=`, `curl`/`wget` naming one (a copy *from* a
  dot-file asks too: the pattern cannot tell a source from a destination).
(`busybox rm -rf /` is `rm -rf /` to the parser, and `python3 -c …` is opaque: see wrappers.py.)
With these rules a command the parser cannot see through asks too (the policy's opaque decision).
"""

from __future__ import annotations

from typing import Any

from mcpserver.policy.rules import Decision, Policy, Rule

_BLOCK_DEVICES = "|".join(
    f"/dev/{name}"
    for name in ("sd*", "hd*", "vd*", "xvd*", "nvme*", "mmcblk*", "md*", "dm-*", "loop*", "disk/**", "mapper/**")
)
_SHELLS_AND_INTERPRETERS = "sh|bash|zsh|dash|ksh|mksh|ash|fish|python*|pypy*|perl*|ruby*|node|nodejs|php*|lua*"
_HOME_DOTFILES = "~/.*|~/.*/**"

RECOMMENDED: list[dict[str, Any]] = [
    {
        "id": "make-filesystem",
        "decision": "deny",
        "commands": ["mkfs|mkfs.*|mke2fs|mkswap"],
        "description": "Making a file system erases what the device held.",
    },
    {
        "id": "write-block-device",
        "decision": "deny",
        "commands": [
            "dd " + "|".join(f"of={device}" for device in _BLOCK_DEVICES.split("|")),
            f">{_BLOCK_DEVICES}",
            f"tee {_BLOCK_DEVICES}",
            f"cp|mv|install ** {_BLOCK_DEVICES}",
        ],
        "description": "Writing a disk device directly destroys its file systems.",
    },
    {
        "id": "power-off",
        "decision": "deny",
        "commands": [
            "shutdown|reboot|halt|poweroff",
            "init|telinit 0|6",
            "systemctl poweroff|reboot|halt|kexec",
        ],
        "description": "Stopping or restarting the host cuts everyone off.",
    },
    {
        "id": "rm-recursive-outside-repos",
        "decision": "ask",
        "commands": [
            {"pattern": "rm -r|-R|--recursive", "when": "outside-repos"},
            {"pattern": "find -delete", "when": "outside-repos"},
        ],
        "description": "Removing a tree that no git repository holds cannot be undone.",
    },
    {
        "id": "rsync-delete",
        "decision": "ask",
        "commands": [
            "rsync --delete|--del|--delete-before|--delete-during|--delete-delay|--delete-after|--delete-excluded",
            "rsync --remove-source-files",
        ],
        "description": "rsync deletes what the source does not have; the destination may be anywhere.",
    },
    {
        "id": "force-push",
        "decision": "ask",
        "commands": [
            "git push -f|--force|--force-with-lease|--mirror|--delete|-d|--prune",
            "git push +**",
            "git push :**",
        ],
        "description": "A forced push, a mirror or a deleting push can drop other people's commits from the remote.",
    },
    {
        "id": "privilege",
        "decision": "ask",
        "commands": ["sudo|doas|su|pkexec"],
        "description": "Running as another user, usually root.",
    },
    {
        "id": "download-to-shell",
        "decision": "ask",
        "commands": [f"curl|wget | {_SHELLS_AND_INTERPRETERS}"],
        "description": "Running a script straight from the network.",
    },
    {
        "id": "chmod-recursive",
        "decision": "ask",
        "commands": ["chmod -R|--recursive"],
        "description": "Changing the modes of a whole tree.",
    },
    {
        "id": "home-dotfiles",
        "decision": "ask",
        "tools": [
            "file_write",
            "file_edit",
            "file_multi_edit",
            "apply_patch",
            "file_delete",
            "file_move",
            "file_mkdir",
            "terminal_exec",
            "terminal_exec_background",
        ],
        "paths": ["~/.*", "~/.*/**"],
        "commands": [
            f">{_HOME_DOTFILES}",
            f"tee|cp|mv|ln|install {_HOME_DOTFILES}",
            f"sed -i|--in-place {_HOME_DOTFILES}",
            "dd of=~/.*|of=~/.*/**",
            f"curl|wget {_HOME_DOTFILES}",
        ],
        "description": "Dot-files in the home configure shells, ssh, git and more: a change there outlives the task.",
    },
]


def recommended_rules() -> tuple[Rule, ...]:
    return tuple(Rule.from_dict(rule, index) for index, rule in enumerate(RECOMMENDED))


def recommended_policy(default: Decision = "allow") -> Policy:
    """The recommended rules alone, with `default` for everything else (and `ask` for opaque commands)."""
    return Policy(rules=recommended_rules(), default=default)
