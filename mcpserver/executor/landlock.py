"""Landlock, the kernel's unprivileged sandbox (Linux 5.13+), through its three system calls.

A ruleset lists the accesses it *handles* (everything not handled stays allowed) and, per file or directory
hierarchy, which of them are allowed there; `restrict_self` then binds the calling thread, and every process it
starts afterwards, to it for good. Each ABI version adds rights: 2 file reparenting (REFER), 3 TRUNCATE, 4 TCP
bind/connect, 5 device ioctls, 6 scoping of abstract Unix sockets and signals. A ruleset asks only for what the
running kernel knows, so an older kernel enforces less, never nothing; `Ruleset.abi` says which version was used.

Written by hand over ctypes (docs/security.md, *Kernel confinement*, says why no binding was taken).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

# System call numbers: one table for every architecture Linux added Landlock on (5.13, after the 2019 unification).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

READ = READ_FILE | READ_DIR
# The rights a rule on a single file (not a directory) may carry.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


def fs_rights(abi: int) -> int:
    """Every file-system right the kernel of ABI `abi` knows."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


WRITE = fs_rights(99) & ~(EXECUTE | READ)  # every right that changes the file system


class LandlockUnavailable(Exception):
    """The kernel cannot enforce a ruleset: its message says why, in words for an admin."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
    return result


def abi_version() -> int:
    """The Landlock ABI the kernel offers; raises LandlockUnavailable when it offers none."""
    if platform.system() != "Linux":
        raise LandlockUnavailable(f"Landlock is a Linux feature; this is {platform.system()}")
    result = _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if result >= 0:
        return int(result)
    number = ctypes.get_errno()
    if number == errno.EOPNOTSUPP:
        raise LandlockUnavailable("Landlock is built into this kernel but turned off (add it to the lsm= boot option)")
    if number == errno.ENOSYS:
        raise LandlockUnavailable(f"this kernel ({platform.release()}) has no Landlock (Linux 5.13 or newer has)")
    raise LandlockUnavailable(f"Landlock refused: {os.strerror(number)}")


class Ruleset:
    """A Landlock ruleset being built: `allow` paths, `allow_port`s, then `restrict_self` on a thread.

    `handled_net` and `scoped` are dropped on kernels too old for them (`abi` says what was asked for).
    """

    def __init__(self, *, handled_fs: int, handled_net: int = 0, scoped: int = 0) -> None:
        self.abi = abi_version()
        self.handled_fs = handled_fs & fs_rights(self.abi)
        self.handled_net = handled_net if self.abi >= 4 else 0
        self.scoped = scoped if self.abi >= 6 else 0
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        size = 8 if self.abi < 4 else 16 if self.abi < 6 else 24
        self.fd = _check(
            _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
            "landlock_create_ruleset",
        )

    def allow(self, path: str, rights: int) -> bool:
        """Allow `rights` on `path` and beneath it (only FILE_RIGHTS when it is a file). False if it does not exist."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            if not os.path.isdir(f"/proc/self/fd/{fd}"):
                rights &= FILE_RIGHTS
            rights &= self.handled_fs
            if rights:
                attr = _PathBeneathAttr(rights, fd)
                _check(
                    _syscall(
                        _ADD_RULE, self.fd, ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(attr), ctypes.c_uint32(0)
                    ),
                    f"landlock_add_rule({path})",
                )
        finally:
            os.close(fd)
        return True

    def allow_port(self, port: int, rights: int) -> None:
        if not self.handled_net:
            return
        attr = _NetPortAttr(rights & self.handled_net, port)
        _check(
            _syscall(_ADD_RULE, self.fd, ctypes.c_int(_RULE_NET_PORT), ctypes.byref(attr), ctypes.c_uint32(0)),
            f"landlock_add_rule(port {port})",
        )

    def restrict_self(self) -> None:
        """Bind the calling thread (and every process it starts from now on) to this ruleset, for good.

        Sets no_new_privs on the thread first, as the kernel requires: a setuid program it starts gains nothing.
        """
        one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
        _check(_libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), one, zero, zero, zero), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(_syscall(_RESTRICT_SELF, self.fd, ctypes.c_uint32(0)), "landlock_restrict_self")

    def close(self) -> None:
        os.close(self.fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4


def drop_capabilities() -> None:
    """Drop every capability of the calling thread for good (bounding set, ambient, effective, permitted), so that
    a thread of a root process is held by file permissions, and by other processes' dumpable flags, as any user."""
    zero = ctypes.c_ulong(0)
    _libc.prctl(ctypes.c_int(_PR_CAP_AMBIENT), ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), zero, zero, zero)
    for number in range(64):
        if _libc.prctl(ctypes.c_int(_PR_CAPBSET_DROP), ctypes.c_ulong(number), zero, zero, zero) < 0:
            if ctypes.get_errno() == errno.EINVAL:
                break  # past the last capability this kernel knows
            if ctypes.get_errno() == errno.EPERM:
                break  # no CAP_SETPCAP: an unprivileged thread, whose bounding set grants nothing anyway
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
