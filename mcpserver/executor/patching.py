"""apply_patch's OS part: every file a patch names read beneath the workspace root, every new content computed in
memory, then all of them written, or none.

Reading. Each path is resolved and confined as file_edit's is (Workspace.resolve, then opened beneath a descriptor
of the root with O_NOFOLLOW, see beneath.py): Add File and Update File follow a symlink whose target is inside the
workspace and write that target, as file_write and file_edit do; Delete File and a Move to's destination act on the
name as written (its parent resolved), so they never follow a link, and they refuse one rather than remove or
replace it. Operations apply in the patch's order, each to what the ones before it left (an Update after an Add of
the same file patches the added text), so a hunk that does not apply, or a path refused, ends the call before
anything is written.

Writing is one transaction (`_Transaction`):
1. stage: every new content goes to a dot-prefixed temporary file in its target's directory (created O_EXCL
   through the directory's descriptor, fsynced, given the original's mode and owner, 0644 for a new file); every
   file that will be replaced or removed is kept under a dot-prefixed name beside it (a hard link, or a copy of
   what was read where the file system refuses the link); missing parent directories are made;
2. check: every target is still the file that was read (device, inode, size, modification time), and a new file's
   name is still free: otherwise nothing is done and the error says which file changed meanwhile;
3. swap: each temporary file is renamed over its target and each deleted file unlinked, in the patch's order. If a
   step fails, the steps done are undone in reverse (each kept file renamed back, each new file removed) and the
   directories made are removed: the error then says no file was changed;
4. the kept files are removed.
A reader sees each file whole, old or new. Between the first rename and the last (a few system calls), some files
are new and others still old; an executor killed in that window leaves the kept files (`.<name>.<hex>.patch-old`)
to restore from, and the failure of an undo is named in the error with the file that holds the old content.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from mcpserver.executor.editing import BINARY_PROBE, BOM, MAX_EDIT_BYTES, TEMP_NAME_MAX, _read_all
from mcpserver.executor.edits import Applied, unified_diff
from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.patch import AddFile, DeleteFile, FileOp, UpdateFile, apply_hunks, parse_patch
from mcpserver.executor.paths import Workspace, os_failure
from mcpserver.executor.textsize import cut_to_json_size, json_size

logger = logging.getLogger(__name__)

NEW_FILE_MODE = 0o644  # as file_write creates a file
TEMP_SUFFIX, KEPT_SUFFIX = ".patch", ".patch-old"
TRUNCATED = "\n[diff cut to fit the result; git_diff or file_read shows the rest]\n"
UNCHANGED = "so no file was changed"


@dataclass
class _Target:
    """One path the patch changes: what was there when it was first read, and what the patch leaves there."""

    real: Path
    found: os.stat_result | None  # None: nothing was there
    before: bytes | None  # what was read (None: nothing)
    after: bytes | None  # what the patch leaves (None: nothing)
    mode: int = NEW_FILE_MODE
    owner: tuple[int, int] | None = None  # None: the executor's own

    def __post_init__(self) -> None:
        if self.found is not None:
            self.mode, self.owner = stat.S_IMODE(self.found.st_mode), (self.found.st_uid, self.found.st_gid)


@dataclass(frozen=True)
class _Change:
    """One operation of the patch as the result reports it; `before`/`after` are the file around that operation."""

    action: str  # added, updated, moved, deleted
    path: Path
    source: Path | None  # where a moved file was
    before: bytes | None
    after: bytes | None
    replaced: bool = False  # an Add or a Move onto a file that was there


class PatchOps:
    """The patch half of the executor; composed into LocalExecutor, which sets `workspace`."""

    workspace: Workspace

    async def apply_patch(self, patch: str, result_budget: int) -> dict[str, Any]:
        return await asyncio.to_thread(self._apply_patch, patch, result_budget)

    def _apply_patch(self, patch: str, result_budget: int) -> dict[str, Any]:
        try:
            patch.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate from a JSON "\ud800" escape
            raise ToolFailure(f"Error: the patch is not valid Unicode text ({exc.reason})") from exc
        targets, changes = self._plan(parse_patch(patch))
        self._commit([target for target in targets.values() if target.after != target.before])
        return _report(changes, result_budget)

    # --- reading, and the new contents -------------------------------------------------------------------------------

    def _plan(self, ops: tuple[FileOp, ...]) -> tuple[dict[Path, _Target], list[_Change]]:
        targets: dict[Path, _Target] = {}
        changes = []
        for op in ops:
            if isinstance(op, AddFile):
                changes.append(self._add(op, targets))
            elif isinstance(op, DeleteFile):
                changes.append(self._delete(op, targets))
            else:
                changes.append(self._update(op, targets))
        return targets, changes

    def _add(self, op: AddFile, targets: dict[Path, _Target]) -> _Change:
        target = self._target(self.workspace.resolve(op.path), targets)
        before, target.after = target.after, op.content.encode("utf-8")
        return _Change("added", target.real, None, before, target.after, replaced=before is not None)

    def _delete(self, op: DeleteFile, targets: dict[Path, _Target]) -> _Change:
        target = self._target(self._named(op.path, "delete"), targets)
        if target.after is None:
            raise ToolFailure(f"Error: {target.real}: No such file or directory (patch line {op.at}), {UNCHANGED}")
        before, target.after = target.after, None
        return _Change("deleted", target.real, None, before, None)

    def _update(self, op: UpdateFile, targets: dict[Path, _Target]) -> _Change:
        source = self._target(self.workspace.resolve(op.path), targets)
        if source.after is None:
            raise ToolFailure(f"Error: {source.real}: No such file or directory (patch line {op.at}), {UNCHANGED}")
        before = after = source.after
        if op.hunks:
            text, bom = _text(before, source.real)
            after = bom + apply_hunks(text, op.hunks, str(source.real)).text.encode("utf-8")
        destination = self._named(op.move_to, "move onto") if op.move_to is not None else source.real
        if destination == source.real:
            source.after = after
            return _Change("updated", source.real, None, before, after)
        target = self._target(destination, targets)
        replaced = target.after is not None
        source.after, target.after = None, after
        target.mode, target.owner = source.mode, source.owner  # the file moves: its mode and owner with it
        return _Change("moved", destination, source.real, before, after, replaced)

    def _named(self, path: str, verb: str) -> Path:
        """`path`'s parent resolved and confined, its last component as written: a link there is not followed."""
        trimmed = path.rstrip("/")
        name = os.path.basename(trimmed)
        if name in ("", ".", ".."):
            raise ToolFailure(f"Error: {path}: will not {verb} the workspace root or a '.'/'..' path")
        if "\x00" in name:
            raise ToolFailure(f"Error: {path!r} contains a NUL byte")
        return self.workspace.resolve(os.path.dirname(trimmed)) / name

    def _target(self, real: Path, targets: dict[Path, _Target]) -> _Target:
        """The patch's view of `real`: as an earlier operation left it, else as it is on disk."""
        found = targets.get(real)
        if found is None:
            found = targets[real] = self._snapshot(real)
        return found

    def _snapshot(self, real: Path) -> _Target:
        if real == self.workspace.root:
            raise ToolFailure(f"Error: {real}: Is a directory")
        try:
            # O_NOFOLLOW: a link named by a Delete or a Move (or swapped in since resolve looked) is refused, not
            # followed. O_NONBLOCK: a FIFO fails the S_ISREG test below instead of blocking until a writer comes.
            fd = self.workspace.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return _Target(real, None, None, None)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolFailure(
                    f"Error: {real}: a symbolic link; apply_patch neither deletes nor replaces links "
                    f"(file_delete removes one), {UNCHANGED}"
                ) from exc
            raise os_failure(real, exc) from exc
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolFailure(f"Error: {real}: Is a directory")
            if not stat.S_ISREG(info.st_mode):
                raise ToolFailure(f"Error: {real}: Not a regular file, {UNCHANGED}")
            if info.st_size > MAX_EDIT_BYTES:
                raise ToolFailure(f"Error: {real}: {info.st_size} bytes, over apply_patch's limit of {MAX_EDIT_BYTES}")
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb", buffering=0) as file:
            data = _read_all(file, info.st_size + 1)
        if len(data) > MAX_EDIT_BYTES:
            raise ToolFailure(f"Error: {real}: grew past apply_patch's limit of {MAX_EDIT_BYTES} bytes while read")
        return _Target(real, info, data, data)

    # --- writing -------------------------------------------------------------------------------------------------

    def _commit(self, targets: list[_Target]) -> None:
        with _Transaction(self.workspace) as transaction:
            for target in targets:
                transaction.stage(target)
            transaction.check()
            transaction.swap()


def _text(data: bytes, real: Path) -> tuple[str, bytes]:
    """A file's text to patch (its BOM apart, kept to write back), refusing a binary file."""
    bom = BOM if data.startswith(BOM) else b""
    body = data[len(bom) :]
    if b"\x00" in body[:BINARY_PROBE]:
        raise ToolFailure(f"Error: {real}: binary file, not patched, {UNCHANGED}")
    try:
        return body.decode("utf-8"), bom
    except UnicodeDecodeError:
        raise ToolFailure(f"Error: {real}: binary file (not valid UTF-8), not patched, {UNCHANGED}") from None


@dataclass
class _Step:
    """What the transaction does at one target: the directory it is in, its staged content and its kept file."""

    target: _Target
    directory: int  # an O_PATH descriptor, opened beneath the root
    name: str
    temp: str | None = None  # the new content, until renamed over the target
    kept: str | None = None  # the file that was there, until the patch is done or undone
    linked: bool = False  # `kept` is a hard link to it (not a copy)
    done: bool = False


class _Transaction:
    """Stage, check, swap; on leaving, the temporary and kept files are removed, and on failure the directories
    made (see the module's docstring)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.directories: dict[Path, int] = {}
        self.made: list[Path] = []
        self.steps: list[_Step] = []
        self.committed = False

    def __enter__(self) -> _Transaction:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for step in self.steps:
            if step.temp is not None:
                _remove(step.temp, step.directory)
            if step.kept is not None and (self.committed or not step.done):  # kept when an undo failed
                _remove(step.kept, step.directory)
        if not self.committed:
            for path in sorted(self.made, key=lambda made: len(made.parts), reverse=True):
                self._remove_directory(path)
        for fd in self.directories.values():
            os.close(fd)

    def stage(self, target: _Target) -> None:
        directory = self._directory(target.real.parent, make=target.after is not None)
        step = _Step(target, directory, target.real.name)
        self.steps.append(step)
        try:
            if target.after is not None:
                step.temp = _write_temp(directory, step.name, TEMP_SUFFIX, target.after, target.mode, target.owner)
            if target.found is not None:
                step.kept, step.linked = _keep(directory, step.name, target)
        except OSError as exc:
            raise os_failure(target.real, exc) from exc

    def check(self) -> None:
        """Every target still the file read (a new file's name still free): else nothing is done."""
        for step in self.steps:
            found, now = step.target.found, _lstat(step.name, step.directory)
            if found is None and now is not None:
                raise ToolFailure(f"Error: {step.target.real}: appeared while the patch was applied, {UNCHANGED}")
            kept = _lstat(step.kept, step.directory) if step.linked and step.kept else None
            if found is not None and (not _same(now, found) or (step.linked and not _same(kept, found))):
                raise ToolFailure(
                    f"Error: {step.target.real}: changed while the patch was applied, {UNCHANGED}; "
                    "read it again and resend the patch"
                )

    def swap(self) -> None:
        for step in self.steps:
            try:
                if step.temp is not None:
                    os.rename(step.temp, step.name, src_dir_fd=step.directory, dst_dir_fd=step.directory)
                    step.temp = None
                else:
                    os.unlink(step.name, dir_fd=step.directory)
            except OSError as exc:
                self._undo(step.target.real, exc)
            step.done = True
        self.committed = True

    def _undo(self, failed: Path, exc: OSError) -> None:
        """Restore what the steps done changed, the last first; raise the failure saying whether that worked."""
        stuck = []
        for step in reversed([step for step in self.steps if step.done]):
            try:
                if step.kept is not None:
                    os.rename(step.kept, step.name, src_dir_fd=step.directory, dst_dir_fd=step.directory)
                    step.kept = None
                else:
                    os.unlink(step.name, dir_fd=step.directory)
                step.done = False
            except OSError as error:
                logger.error("apply_patch could not restore %s: %s", step.target.real, error)
                kept = f" (its old content is in {step.target.real.parent / step.kept})" if step.kept else ""
                stuck.append(f"{step.target.real}{kept}")
        if stuck:
            raise ToolFailure(
                f"Error: {failed}: {exc.strerror}; the patch was being written and could not be wholly undone: "
                f"these files are as the patch left them: {', '.join(stuck)}"
            ) from exc
        raise ToolFailure(f"Error: {failed}: {exc.strerror}; the files written before it were restored, {UNCHANGED}")

    def _directory(self, real: Path, make: bool) -> int:
        found = self.directories.get(real)
        if found is not None:
            return found
        try:
            try:
                fd = self.workspace.open_dir(real)
            except (FileNotFoundError, NotADirectoryError):
                if not make:
                    raise
                fd = self._make(real)
        except OSError as exc:
            raise os_failure(real, exc) from exc
        self.directories[real] = fd
        return fd

    def _make(self, real: Path) -> int:
        """`mkdir -p real` beneath the root, remembering which directories it made (by name: only so that a patch
        undone removes them again, and a directory is only ever removed when empty, beneath the root)."""
        missing = []
        path = real
        while path not in (self.workspace.root, path.parent) and not os.path.lexists(path):
            missing.append(path)
            path = path.parent
        fd = self.workspace.make_dirs(real)
        self.made.extend(missing)
        return fd

    def _remove_directory(self, path: Path) -> None:
        try:
            parent = self.workspace.open_dir(path.parent)
        except (OSError, ToolFailure):
            return
        try:
            os.rmdir(path.name, dir_fd=parent)
        except OSError:
            pass  # not empty (something else was put there meanwhile), or gone: left as it is
        finally:
            os.close(parent)


def _temp_name(name: str, suffix: str) -> str:
    kept = os.fsdecode(os.fsencode(name)[:TEMP_NAME_MAX])  # cut in bytes: a name is at most 255 bytes
    return f".{kept}.{secrets.token_hex(6)}{suffix}"


def _write_temp(directory: int, name: str, suffix: str, data: bytes, mode: int, owner: tuple[int, int] | None) -> str:
    temp = _temp_name(name, suffix)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fchmod(fd, mode)
            if owner is not None:
                try:
                    os.fchown(fd, *owner)
                except PermissionError:
                    pass  # not root and the file was someone else's: it becomes ours, as any editor's rewrite does
            os.fsync(fd)
    except BaseException:
        _remove(temp, directory)
        raise
    return temp


def _keep(directory: int, name: str, target: _Target) -> tuple[str, bool]:
    """The file at `name` kept beside it until the patch is done: (its kept name, whether it is a hard link)."""
    kept = _temp_name(name, KEPT_SUFFIX)
    try:
        os.link(name, kept, src_dir_fd=directory, dst_dir_fd=directory, follow_symlinks=False)
        return kept, True
    except OSError:  # no hard links here (a file system without them, or protected_hardlinks): a copy of what was read
        assert target.before is not None  # a target found on disk was read
        return _write_temp(directory, name, KEPT_SUFFIX, target.before, target.mode, target.owner), False


def _lstat(name: str | None, directory: int) -> os.stat_result | None:
    if name is None:
        return None
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _same(now: os.stat_result | None, then: os.stat_result) -> bool:
    if now is None:
        return False
    return (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) == (
        then.st_dev,
        then.st_ino,
        then.st_size,
        then.st_mtime_ns,
    )


def _remove(name: str, directory: int) -> None:
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        pass
    except OSError as error:  # on the way out of a call: what failed before matters more; logged, never raised
        logger.warning("apply_patch could not remove its file %s: %s", name, error)


# --- the result ------------------------------------------------------------------------------------------------------


def _report(changes: list[_Change], budget: int) -> dict[str, Any]:
    """{"files": [{action, path, moved_from?, added_lines, removed_lines}], "text": a line per file and the diff,
    within `budget` JSON bytes beside the files' list, "diff_truncated"}."""
    files, summary, diffs = [], [], []
    for change in changes:
        diff = _diff(change)
        body = diff.split("\n")[2:]
        added = sum(1 for line in body if line.startswith("+"))
        removed = sum(1 for line in body if line.startswith("-"))
        entry: dict[str, Any] = {"action": change.action, "path": str(change.path)}
        if change.source is not None:
            entry["moved_from"] = str(change.source)
        files.append({**entry, "added_lines": added, "removed_lines": removed})
        summary.append(_summary_line(change, added, removed))
        diffs.append(diff)
    total_added = sum(entry["added_lines"] for entry in files)
    total_removed = sum(entry["removed_lines"] for entry in files)
    head = f"Applied the patch to {len(files)} file{'s' if len(files) != 1 else ''} (+{total_added} -{total_removed}):"
    text = "\n".join([head, *summary]) + "\n\n" + "".join(diffs)
    room = budget - json_size(json.dumps(files, ensure_ascii=False))
    shown = text if json_size(text) <= room else _cut(text, room)
    return {"files": files, "text": shown, "diff_truncated": shown != text}


def _summary_line(change: _Change, added: int, removed: int) -> str:
    where = f"{change.source} \u2192 {change.path}" if change.source is not None else str(change.path)
    replaced = " (replacing the file there)" if change.replaced else ""
    counts = " ".join(count for count in (f"+{added}" if added else "", f"-{removed}" if removed else "") if count)
    return f"{change.action} {where}{replaced}" + (f" ({counts})" if counts else "")


def _diff(change: _Change) -> str:
    """The unified diff of one operation, `--- old` / `+++ new` (`/dev/null` for an added or a deleted file)."""
    old = "/dev/null" if change.before is None else str(change.source or change.path)
    new = "/dev/null" if change.after is None else str(change.path)
    before, after = change.before or b"", change.after or b""
    if not (_is_text(before) and _is_text(after)):
        return f"--- {old}\n+++ {new}\nBinary file, not shown\n"
    body = unified_diff(before, Applied.of(before, after, 0), new)
    return f"--- {old}\n+++ {new}\n" + (body.split("\n", 2)[2] if body else "")


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in data[:BINARY_PROBE]


def _cut(text: str, budget: int) -> str:
    head = cut_to_json_size(text, max(budget - json_size(TRUNCATED), 0))
    return head[: head.rfind("\n") + 1] + TRUNCATED.lstrip("\n")
