"""The cgroup of each credential (mcpserver.executor.credential_groups), on the kernel's own cgroup v2 file system:
what a command forks before it is moved follows it, revoking ends a credential's groups (and only those made
before the revocation, and only its own), and an executor with no cgroup to manage says so.

Each case runs in a process of its own: setting the groups up moves the calling process into them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from mcpserver.executor import cgroupfs, credential_groups

ROOT = Path(__file__).resolve().parent.parent

needs_cgroups = pytest.mark.skipif(cgroupfs.own_cgroup() is None, reason="no cgroup v2 hierarchy mounted here")

# Runs in a child process: sets the groups up, starts commands for credentials through `placed` as spawn.py does,
# ends some, and prints what it saw as JSON.
SCENARIO = textwrap.dedent(
    r"""
    import asyncio, json, os, subprocess, sys, time
    from mcpserver.executor import cgroupfs, credential_groups as cg

    tracking = cg.set_up(sys.argv[1])
    assert tracking.describe() == "tracked", tracking.describe()

    def start(key, command, linger=0.0):
        cg.PRINCIPAL.set(key)
        def popen():
            process = subprocess.Popen(["bash", "-c", command], start_new_session=True)
            time.sleep(linger)  # the command forks before it is moved: what it forked must follow it
            return process
        return tracking.placed(popen)

    def alive(marker):
        marker += sys.argv[2]
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if cmdline.split(b"\0")[0] == marker.encode() and state != "Z":  # exec -a names it
                found.append(int(pid))
        return sorted(found)

    started = time.time()
    leave = "(setsid bash -c 'exec -a {m}%s sleep 60' </dev/null >/dev/null 2>&1 &); sleep 0.05" % sys.argv[2]
    a = start("bearer:1", leave.format(m="markA"), linger=0.5)
    b = start("bearer:2", leave.format(m="markB"))
    c = start("oauth:7:1", leave.format(m="markC"))
    for process in (a, b, c):
        process.wait()
    time.sleep(0.2)
    seen = {m: alive(m) for m in ("markA", "markB", "markC")}
    strays = [pid for pid in cgroupfs.members(tracking.leaf) if pid != os.getpid()]
    # A revocation older than the credential's group: made before its first call, it ends none of them.
    killed_none = asyncio.run(tracking.end(["bearer:1"], [], started - 1))
    killed = asyncio.run(tracking.end(["bearer:1"], [], time.time()))
    d = start("bearer:1", leave.format(m="markD"))  # a call of the same key after the revocation: a new group
    d.wait()
    time.sleep(0.2)
    after_one = {m: alive(m) for m in ("markA", "markB", "markC", "markD")}
    # A call still running when its credential is revoked: the server that runs it cancels it (and says so), so
    # only what it left in sessions of their own is killed here.
    running = start("bearer:3", leave.format(m="markE") + "; exec -a markF%s sleep 60" % sys.argv[2])
    time.sleep(0.3)
    killed_running = asyncio.run(tracking.end(["bearer:3"], [], time.time()))
    still = {m: alive(m) for m in ("markE", "markF")}
    running.kill()
    running.wait()
    killed_prefix = asyncio.run(tracking.end([], ["oauth:"], time.time()))
    after_prefix = {m: alive(m) for m in ("markB", "markC", "markD")}
    asyncio.run(tracking.end(["bearer:1", "bearer:2"], [], time.time()))
    leftover = {m: alive(m) for m in ("markA", "markB", "markC", "markD")}
    tracking.close()
    print(json.dumps({
        "seen": seen, "strays": strays, "killed_running": killed_running, "still": still, "killed_none": killed_none, "killed": killed, "after_one": after_one,
        "killed_prefix": killed_prefix, "after_prefix": after_prefix, "leftover": leftover,
        "base_left": os.path.isdir(tracking.base),
    }))
    """
)


@needs_cgroups
def test_a_credentials_processes_are_ended_wherever_they_went(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex[:8]
    run = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(tmp_path), marker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "no cgroup of its own" in run.stderr:
        pytest.skip("this process may not manage its cgroup")
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert all(len(pids) == 1 for pids in seen["seen"].values()), seen["seen"]  # each outlived its command
    assert seen["strays"] == [], "something was left in the executor's own group"
    assert seen["killed_none"] == []
    assert [(p["pid"], p["credential"]) for p in seen["killed"]] == [(seen["seen"]["markA"][0], "bearer:1")]
    assert "markA" in str(seen["killed"][0]["command"])
    after = seen["after_one"]
    assert after["markA"] == [], "the forked-before-its-move process of the revoked credential survived"
    assert after["markB"] and after["markC"], "another credential's processes were ended"
    assert after["markD"], "a process started after the revocation was ended with the revoked ones"
    assert seen["still"]["markE"] == [] and len(seen["still"]["markF"]) == 1
    assert [p["command"].split()[0] for p in seen["killed_running"]] == [f"markE{marker}"]
    assert [p["credential"] for p in seen["killed_prefix"]] == ["oauth:7:1"]
    assert seen["after_prefix"]["markC"] == [] and seen["after_prefix"]["markB"]
    assert all(pids == [] for pids in seen["leftover"].values())
    assert not seen["base_left"], "the executor's groups were left behind once empty"


def test_without_a_cgroup_hierarchy_the_executor_says_revocation_cannot_reach_detached_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cgroupfs, "own_cgroup", lambda: None)
    tracking = credential_groups.set_up("/nowhere")
    assert tracking.describe() == "unavailable: no cgroup v2 hierarchy is mounted"
    assert tracking.placed(lambda: "started") == "started"  # type: ignore[type-var]


@needs_cgroups
def test_a_kernel_without_what_revocation_needs_leaves_tracking_off_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cgroupfs, "CONTROLS", ("cgroup.kill", "cgroup.not-in-this-kernel"))
    own = cgroupfs.own_cgroup()
    tracking = credential_groups.set_up(str(tmp_path))
    if "no cgroup of its own" in tracking.describe():
        pytest.skip("this process may not manage its cgroup")
    assert tracking.describe() == (
        "unavailable: the kernel has no cgroup.not-in-this-kernel (Linux 5.14 or later has both)"
    )
    assert cgroupfs.own_cgroup() == own, "the process was not moved"
    base = f"sandstorm-{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]}"
    assert own is not None and not (own / base).exists(), "the group it made to look was left behind"
