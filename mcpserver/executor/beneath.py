"""Opening a path beneath a directory descriptor, never through a link that leads out of it.

A path checked by name and then used by name again can be redirected in between (a directory swapped for a
symlink with `renameat2(RENAME_EXCHANGE)`). So the file tools open what they act on relative to a descriptor of the
workspace root and then work through descriptors only. Linux 5.6+ does the confinement in one call, `openat2` with
`RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` (links inside the tree are followed, none out of it); where the kernel
lacks it or a seccomp filter refuses it, each directory component is opened in turn with `O_NOFOLLOW`, so a link
met on the way is refused instead of followed. Python 3.11 has no `os.openat2`: it is called through ctypes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

# Tests set this to False to exercise the component walk on a kernel that has openat2.
USE_OPENAT2 = True

SYS_OPENAT2 = 437  # the same number on every architecture: it came after the syscall tables were unified
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
EAGAIN_RETRIES = 16  # openat2 says EAGAIN when a rename raced its resolution; it is safe to try again


class Escape(OSError):
    """The path leads out of the directory it must stay beneath (a link out, `..`, or a link swapped in)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
_available: bool | None = None  # probed once


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE  # O_TMPFILE includes O_DIRECTORY's bit
    how = _OpenHow(flags | os.O_CLOEXEC, mode if creates else 0, RESOLVE)  # openat2 wants no mode otherwise
    encoded = os.fsencode(path)
    for _ in range(EAGAIN_RETRIES):
        fd = _syscall(SYS_OPENAT2, dir_fd, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            break
    if code == errno.EXDEV:
        raise Escape(code, os.strerror(code), path)
    raise OSError(code, os.strerror(code), path)


def openat2_available() -> bool:
    """Whether this kernel runs openat2 for us (not before Linux 5.6; a seccomp filter may say ENOSYS or EPERM)."""
    global _available
    if _available is None:
        try:
            os.close(_openat2(-100, ".", os.O_PATH | os.O_DIRECTORY, 0))  # AT_FDCWD
            _available = True
        except OSError as error:
            if error.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):
                raise
            _available = False
    return _available


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk(dir_fd: int, parts: list[str], flags: int, mode: int) -> int:
    """The fallback: every component opened in turn with O_NOFOLLOW, so any link on the way is refused."""
    current = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for index, name in enumerate(parts):
            last = index == len(parts) - 1
            step = flags | os.O_NOFOLLOW if last else os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                opened = os.open(name, step | os.O_CLOEXEC, mode, dir_fd=current)
            except OSError as error:
                refused_link = error.errno in (errno.ELOOP, errno.ENOTDIR) and (not last or flags & os.O_DIRECTORY)
                if refused_link and _is_link(name, current):
                    raise Escape(errno.EXDEV, "a link in the path leads elsewhere", name) from error
                raise
            os.close(current)
            current = opened
        result, current = current, -1
        return result
    finally:
        if current >= 0:
            os.close(current)


def open_beneath(dir_fd: int, relative: str, flags: int, mode: int = 0) -> int:
    """A descriptor for `relative` (no leading `/`, no `..`; "" is `dir_fd` itself), opened beneath `dir_fd`.

    Raises Escape when it would leave `dir_fd`'s tree, else the OSError of the open (ENOENT, ELOOP for a link
    at the end with O_NOFOLLOW, EISDIR, ...). The descriptor is close-on-exec: tool processes never inherit it.
    """
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if ".." in parts or relative.startswith("/"):
        raise Escape(errno.EXDEV, "the path leaves its directory", relative)
    if USE_OPENAT2 and openat2_available():
        return _openat2(dir_fd, "/".join(parts) or ".", flags, mode)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    return _walk(dir_fd, parts, flags, mode)
