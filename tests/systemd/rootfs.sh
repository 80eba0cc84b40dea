#!/usr/bin/env bash
# The Debian 12 root file system the real-systemd test boots, built once with debootstrap and cached under
# /var/tmp, keyed by suite, mirror and package list. Sourced by tests/systemd/run.sh; prints nothing on a hit.
# shellcheck shell=bash

ROOTFS_SUITE=bookworm
# systemd as PID 1, and what deploy/install.sh would install (so the test does not download it every run).
ROOTFS_PACKAGES=(systemd systemd-sysv dbus ca-certificates python3 python3-venv git caddy curl procps)
ROOTFS_CACHE=/var/tmp/sandstorm-systemd-ci

# The URI of the host's apt source for SUITE (deb822 in /etc/apt/sources.list.d, or one-line sources.list):
# the rootfs comes from the archive the host already uses, named nowhere in this repository.
host_mirror() {
    local suite="$1"
    python3 - "$suite" <<'PY'
import glob, re, sys
suite = sys.argv[1]
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
        if "deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split() \
                and "main" in fields.get("Components", "").split():
            print(fields["URIs"].split()[0])
            sys.exit(0)
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        continue
    for line in lines:
        words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
        if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
            print(words[1])
            sys.exit(0)
sys.exit(f"no apt source for {suite} main on this host (/etc/apt/sources.list.d, /etc/apt/sources.list)")
PY
}

# Prints the cached rootfs' path, building it first if needed (one retry: downloads go through a proxy).
ensure_rootfs() {
    local mirror key dir tmp attempt
    mirror="$(host_mirror "$ROOTFS_SUITE")" || return 1
    key="$(printf '%s\n' "$ROOTFS_SUITE" "$mirror" "${ROOTFS_PACKAGES[@]}" | sha256sum | cut -c1-16)"
    dir="$ROOTFS_CACHE/rootfs-$ROOTFS_SUITE-$key"
    if [ -f "$dir/.complete" ]; then
        printf '%s\n' "$dir"
        return 0
    fi
    mkdir -p "$ROOTFS_CACHE"
    for attempt in 1 2; do
        tmp="$(mktemp -d "$ROOTFS_CACHE/building.XXXXXX")"
        echo "systemd test: building the $ROOTFS_SUITE rootfs with debootstrap (attempt $attempt; cached in $dir)" >&2
        if debootstrap --variant=minbase --include="$(IFS=,; echo "${ROOTFS_PACKAGES[*]}")" \
            "$ROOTFS_SUITE" "$tmp" "$mirror" >"$tmp.log" 2>&1; then
            break
        fi
        echo "systemd test: debootstrap failed; last lines of its log:" >&2
        tail -n 15 "$tmp.log" >&2
        rm -rf "$tmp" "$tmp.log"
        [ "$attempt" -eq 2 ] && return 1
    done
    rm -f "$tmp.log"
    prepare_rootfs "$tmp"
    touch "$tmp/.complete"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    printf '%s\n' "$dir"
}

# What every boot needs and debootstrap leaves out.
prepare_rootfs() {
    local root="$1"
    # Caddy's admin endpoint listens on localhost:2019, which does not resolve without /etc/hosts.
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
    echo sandstorm-ci >"$root/etc/hostname"
    # Nothing to configure on a shared network namespace; no getty on a console nobody reads.
    chroot "$root" systemctl mask systemd-networkd-wait-online.service console-getty.service \
        systemd-timesyncd.service >/dev/null 2>&1 || true
    # The root password is empty but locked; commands go in with nsenter, never a login.
    chroot "$root" passwd -l root >/dev/null
    # Same apt source as the host's, so the installer's apt-get could work inside too.
    printf 'deb %s %s main\n' "$(host_mirror "$ROOTFS_SUITE")" "$ROOTFS_SUITE" >"$root/etc/apt/sources.list"
}
