#!/usr/bin/env bash
# The production install under a real systemd: a Debian 12 rootfs (debootstrap, cached under /var/tmp) booted with
# systemd-nspawn on a throwaway overlay, deploy/install.sh of the committed HEAD inside (an upgrade from HEAD~1),
# then the checks a user would make (tests/systemd/checks.sh), a reboot, and the checks again.
#
#   sudo bash tests/systemd/run.sh        (make test-systemd; .ci/run runs it once)
#
# SANDSTORM_UPGRADE_FROM=REV upgrades from REV instead of HEAD~1 (e.g. the released version).
# Needs root, debootstrap, systemd-container, and ports 80, 443 and 2019 free: the container shares the host's
# network (it downloads packages), so its Caddy listens on the host's ports (an older Caddyfile's admin API on
# 2019 too; a check proves nothing listens there once installed). The container is always powered off and the
# overlay removed, also when a check fails or the run is interrupted. The last line is the summary.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=/dev/null  # checked on its own
source "$HERE/rootfs.sh"
MACHINE=sandstorm-ci
IN_CONTAINER=/root/systemd-test
PASSED=0
FAILED=0
SKIPPED=0
RUN=""
MERGED=""
NSPAWN_PID=""
LEADER=""
BOOTS=0

log() { printf 'systemd test: %s\n' "$*"; }

summary() { printf 'systemd: %d passed, %d failed, %d skipped\n' "$PASSED" "$FAILED" "$SKIPPED"; }

# Exit trap: power the container off, remove the overlay, then the summary line (last, whatever happened).
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    power_off || true
    if [ -n "$MERGED" ] && mountpoint -q "$MERGED"; then
        umount "$MERGED" || umount -l "$MERGED" || true
    fi
    [ -z "$RUN" ] || rm -rf "$RUN"
    [ "$status" -eq 0 ] || [ "$FAILED" -gt 0 ] || FAILED=1
    log "took ${SECONDS}s"
    summary
    exit "$status"
}

preflight() {
    [ "$(id -u)" -eq 0 ] || { log "needs root (debootstrap, systemd-nspawn, mounts)"; return 1; }
    local tool
    for tool in debootstrap systemd-nspawn nsenter ss git; do
        command -v "$tool" >/dev/null || { log "needs $tool (apt-get install debootstrap systemd-container iproute2 git)"; return 1; }
    done
    local busy
    busy="$(ss -Hltnp '( sport = :80 or sport = :443 or sport = :2019 )')"
    if [ -n "$busy" ]; then
        log "ports 80, 443 or 2019 are taken on this host (the container's Caddy needs them, or checks 2019 is free):"
        printf '%s\n' "$busy"
        return 1
    fi
}

# A throwaway overlay on the cached rootfs (a copy where overlayfs is not available), with what this run needs.
prepare_run() {
    local rootfs="$1"
    RUN="$(mktemp -d /var/tmp/sandstorm-systemd-run.XXXXXX)"
    MERGED="$RUN/root"
    mkdir -p "$RUN/upper" "$RUN/work" "$MERGED" "$ROOTFS_CACHE/pip-cache"
    if ! mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$RUN/upper,workdir=$RUN/work" "$MERGED" 2>/dev/null; then
        log "no overlayfs here: copying the rootfs"
        cp -a "$rootfs/." "$MERGED/"
    fi
    # Package downloads go through this host's TLS-inspecting proxy, if any: its CA certificates, trusted inside.
    cp -a /usr/local/share/ca-certificates/. "$MERGED/usr/local/share/ca-certificates/" 2>/dev/null || true
    chroot "$MERGED" update-ca-certificates >/dev/null 2>&1
    # pip inside uses the system bundle (with those CAs), and retries a failed download. The host's own pip
    # settings (local wheel directories) do not exist in there and are not carried over.
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\nretries = 5\ntimeout = 60\n' >"$MERGED/etc/pip.conf"
    printf '127.0.0.1\tsandstorm.localhost\n' >>"$MERGED/etc/hosts"
    copy_checkouts
    mkdir -p "$MERGED$IN_CONTAINER"
    cp "$HERE/checks.sh" "$HERE/mcp_check.py" "$MERGED$IN_CONTAINER/"
}

# The committed HEAD, and HEAD~1 for the upgrade, as git checkouts (the installer installs a checkout's HEAD).
copy_checkouts() {
    local head previous
    head="$(git -C "$REPO" rev-parse HEAD)"
    [ -z "$(git -C "$REPO" status --porcelain --untracked-files=no)" ] ||
        log "warning: $REPO has uncommitted changes; the test installs the committed HEAD ${head:0:12}"
    git clone --quiet --no-hardlinks "$REPO" "$MERGED/root/sandstorm"
    git -C "$MERGED/root/sandstorm" checkout --quiet --detach "$head"
    if previous="$(git -C "$REPO" rev-parse --verify --quiet "${SANDSTORM_UPGRADE_FROM:-HEAD~1}^{commit}")"; then
        git clone --quiet --no-hardlinks "$REPO" "$MERGED/root/sandstorm-prev"
        git -C "$MERGED/root/sandstorm-prev" checkout --quiet --detach "$previous"
        log "HEAD ${head:0:12}, upgrading from ${SANDSTORM_UPGRADE_FROM:-HEAD~1} ${previous:0:12}"
    else
        log "WARNING: HEAD ${head:0:12} has no parent commit in this clone (shallow?): THE UPGRADE CHECK IS SKIPPED"
    fi
}

boot() {
    BOOTS=$((BOOTS + 1))
    # nspawn's own system call filter refuses Landlock (EPERM), which a host's systemd does not: allowed here, so
    # the executor confines its tools as it would on the host.
    systemd-nspawn --quiet --register=no --keep-unit --boot --console=read-only --machine="$MACHINE" \
        --system-call-filter="landlock_create_ruleset landlock_add_rule landlock_restrict_self" \
        --directory="$MERGED" --bind="$ROOTFS_CACHE/pip-cache:/root/.cache/pip" \
        </dev/null >>"$RUN/console.log" 2>&1 &
    NSPAWN_PID=$!
    LEADER=""
    local deadline=$((SECONDS + 30)) pid
    while [ -z "$LEADER" ]; do
        # The container's PID 1: a child or grandchild of systemd-nspawn whose pid in its own namespace is 1.
        for pid in $(pgrep -P "$NSPAWN_PID" || true) $(pgrep -P "$(pgrep -d, -P "$NSPAWN_PID" || echo 0)" || true); do
            if grep -qE '^NSpid:[[:space:]]+[0-9]+[[:space:]]+1$' "/proc/$pid/status" 2>/dev/null; then
                LEADER="$pid"
            fi
        done
        [ -n "$LEADER" ] && break
        kill -0 "$NSPAWN_PID" 2>/dev/null || { log "systemd-nspawn exited:"; tail -n 20 "$RUN/console.log"; return 1; }
        [ "$SECONDS" -lt "$deadline" ] || { log "the container's systemd did not start"; tail -n 20 "$RUN/console.log"; return 1; }
        sleep 0.2
    done
    local state=""
    deadline=$((SECONDS + 120))
    until [[ "$state" == running || "$state" == degraded ]]; do
        state="$(in_ct timeout 60 systemctl is-system-running --wait 2>/dev/null || true)"
        [ "$SECONDS" -lt "$deadline" ] || { log "boot did not finish (state '$state')"; tail -n 20 "$RUN/console.log"; return 1; }
        [[ "$state" == running || "$state" == degraded ]] || sleep 0.5
    done
    log "booted (boot $BOOTS, systemd PID 1 = host pid $LEADER, state $state)"
    if [ "$state" = degraded ]; then
        in_ct systemctl --failed --no-legend --plain | sed 's/^/    failed: /'
    fi
}

# A command inside the running container, as root, with a clean environment.
in_ct() {
    nsenter --target "$LEADER" --all --root -- /usr/bin/env -i -C / \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb "$@"
}

# Wait up to SECONDS for systemd-nspawn to exit; its exit status in NSPAWN_STATUS.
wait_nspawn() {
    local deadline=$((SECONDS + $1))
    while kill -0 "$NSPAWN_PID" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.3
    done
    NSPAWN_STATUS=0
    wait "$NSPAWN_PID" || NSPAWN_STATUS=$?
}

power_off() {
    [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null || return 0
    log "powering the container off"
    in_ct systemctl poweroff >/dev/null 2>&1 || true
    wait_nspawn 60 && return 0
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true
    wait_nspawn 20 && return 0
    kill -KILL "$NSPAWN_PID" 2>/dev/null || true
    wait_nspawn 10 || true
}

reboot_container() {
    in_ct systemctl reboot >/dev/null 2>&1 || true
    # systemd-nspawn exits with 133 when its container reboots; booting it again is the reboot.
    wait_nspawn 90 || { log "the container did not shut down for the reboot"; return 1; }
    [ "$NSPAWN_STATUS" -eq 133 ] || log "note: systemd-nspawn exited with $NSPAWN_STATUS on reboot (133 expected)"
    boot
}

# Run one check of checks.sh inside the container; stop at the first failure, with the services' journals.
check() {
    local name="$1" started=$SECONDS output
    output="$RUN/check.out"
    local status=0
    in_ct bash "$IN_CONTAINER/checks.sh" "$name" >"$output" 2>&1 || status=$?
    if [ "$status" -eq 0 ]; then
        PASSED=$((PASSED + 1))
        log "PASS $name ($((SECONDS - started))s)"
        sed 's/^/    /' "$output"
        return 0
    fi
    if [ "$status" -eq 77 ]; then  # the check cannot be made on this host, and says why
        skip "$name" "$(tail -n 1 "$output")"
        return 0
    fi
    FAILED=$((FAILED + 1))
    log "FAIL $name ($((SECONDS - started))s)"
    sed 's/^/    /' "$output"
    log "journal of the services (last lines):"
    in_ct journalctl -u sandstorm-mcp -u sandstorm-mcp.socket -u sandstorm-mcp-executor -u 'sandstorm-mcp-worker@*' -u sandstorm-mcp-redis -u caddy -n 40 --no-pager -o short-monotonic 2>&1 | sed 's/^/    /' || true
    exit 1
}

skip() {
    SKIPPED=$((SKIPPED + 1))
    log "SKIP $1: $2"
}

main() {
    trap cleanup EXIT
    trap 'log "interrupted"; exit 130' INT
    trap 'log "terminated"; exit 143' TERM
    preflight
    local rootfs started=$SECONDS
    rootfs="$(ensure_rootfs)"
    log "rootfs ready in $((SECONDS - started))s: $rootfs"
    prepare_run "$rootfs"
    boot
    if [ -d "$MERGED/root/sandstorm-prev" ]; then
        check install_previous
        check install_head
        check upgrade_kept_data
    else
        skip upgrade "no parent commit of HEAD in $REPO"
        check install_head
    fi
    check units_active
    check health_through_caddy
    check mcp_exec_as_agent
    check agent_locked_out
    check agent_reaches_no_listener
    check agent_writes_only_workspace
    check confinement_in_production
    check revoke_ends_detached_processes
    check second_install_changes_nothing
    check socket_activation
    check server_restart_refuses_nothing
    check background_survives_restart
    check background_followed_across_restarts
    check toolkit_search
    check timers_services
    check executor_limits
    check fork_flood_stops_at_tasks_max
    log "rebooting the container"
    reboot_container
    check units_active
    check health_through_caddy
    check mcp_exec_as_agent
    check agent_reaches_no_listener
    check agent_writes_only_workspace
    check workers
}

main "$@"
