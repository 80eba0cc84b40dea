#!/usr/bin/env bash
# The real-systemd test's checks, run INSIDE the booted container (as root) by tests/systemd/run.sh, one per call:
#   bash checks.sh NAME
# Each prints what it saw and exits non-zero when that is not what a user should see. State shared between
# checks (the token, a background pid, services' pids) is kept in files under $STATE.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="$HERE/state"
DOMAIN=sandstorm.localhost
AGENT=sandstorm-agent
SERVICE=sandstorm-mcp
EXECUTOR=sandstorm-mcp-executor
ENV_FILE=/etc/sandstorm-mcp.env
STATE_DIR=/var/lib/sandstorm-mcp
DAPHNE_SOCKET=/run/sandstorm-mcp/worker-1.sock
EXECUTOR_SOCKET=/run/sandstorm-mcp-executor/executor.sock
CADDY_ADMIN_SOCKET=/run/caddy/admin.sock
WORKSPACE=/home/sandstorm-agent/workspace
CADDY_CA=/var/lib/caddy/.local/share/caddy/pki/authorities/local/root.crt
VENV_PY=/opt/sandstorm-mcp/venv/bin/python
TIMERS=(backup cleartokens prune-clients prune-output audit-prune)
mkdir -p "$STATE"

fail() {
    printf 'FAILED: %s\n' "$*"
    exit 1
}

# Poll COMMAND until it succeeds, for at most SECONDS.
wait_for() {
    local seconds="$1" end
    shift
    end=$((SECONDS + seconds))
    until "$@"; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.5
    done
}

install() {
    local checkout="$1" log
    log="$STATE/install-$(date +%s%N).log"
    echo "install.sh from $checkout (log: $log)"
    if ! (cd "$checkout" && SANDSTORM_DOMAIN="$DOMAIN" bash deploy/install.sh) >"$log" 2>&1; then
        tail -n 25 "$log"
        return 1
    fi
    grep -q '^Sandstorm is running at ' "$log" || fail "install.sh did not print 'Sandstorm is running'"
    grep -E '^(==>|install.sh: warning)' "$log" | sed 's/^/    /' | tail -n 40
}

https_status() { curl --silent --max-time 20 --cacert "$CADDY_CA" -o "${2:-/dev/null}" -w '%{http_code}' "https://$DOMAIN$1" || true; }

mcp() { "$VENV_PY" "$HERE/mcp_check.py" "$DOMAIN" "$CADDY_CA" "$STATE/token" "$@"; }

main_pid() { systemctl show -P MainPID "$1"; }

# May USER connect to the Unix socket PATH? (Exit 0 if it may.)
can_connect() {
    runuser -u "$1" -- python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as error:
    print(error)
    sys.exit(1)' "$2" >/dev/null 2>&1
}

# --- checks ------------------------------------------------------------------------------------------------------

check_install_previous() {
    install /root/sandstorm-prev || {
        # The previous commit may predate the fix for the 502 (Caddy could not reach Daphne's socket): its own
        # installer may fail on that. What matters is what the upgrade to HEAD keeps and repairs.
        echo "note: the previous commit's installer failed (see above); the upgrade to HEAD must repair it"
    }
    systemctl is-active --quiet "$SERVICE.service" || fail "the previous commit's server is not running"
    # Data an upgrade must keep: a token (made with the old code, used by every later MCP check), a file in the
    # workspace, and the audit chain.
    sandstorm-manage create_token systemd-test 2>/dev/null | tail -n 1 >"$STATE/token"
    [ -s "$STATE/token" ] || fail "create_token printed no token"
    runuser -u "$AGENT" -- sh -c "echo kept >/home/$AGENT/workspace/upgrade-marker"
    echo "made a token and /home/$AGENT/workspace/upgrade-marker with the previous commit"
}

check_install_head() {
    install /root/sandstorm || fail "install.sh of HEAD failed"
    if [ ! -s "$STATE/token" ]; then
        sandstorm-manage create_token systemd-test 2>/dev/null | tail -n 1 >"$STATE/token"
    fi
}

check_upgrade_kept_data() {
    [ "$(cat "/home/$AGENT/workspace/upgrade-marker")" = kept ] || fail "the workspace file made before the upgrade is gone"
    sandstorm-manage migrate --check >/dev/null || fail "unapplied migrations after the upgrade"
    sandstorm-manage audit_verify | tail -n 1
    echo "workspace file kept, no unapplied migration, audit chain verifies"
}

check_units_active() {
    local unit
    for unit in "$SERVICE.socket" "$SERVICE.service" "$EXECUTOR.socket" "$EXECUTOR.service" caddy.service; do
        systemctl is-active --quiet "$unit" || fail "$unit is $(systemctl is-active "$unit")"
    done
    echo "active: $SERVICE.socket $SERVICE.service $EXECUTOR.socket $EXECUTOR.service caddy.service"
    # The socket's lock, its directory: the server's user and Caddy's group only, whatever restarted.
    local lock
    lock="$(stat -c '%A %U %G' "$(dirname "$DAPHNE_SOCKET")")"
    [ "$lock" = "drwxr-x--- sandstorm caddy" ] || fail "$(dirname "$DAPHNE_SOCKET") is '$lock', not 'drwxr-x--- sandstorm caddy'"
    echo "$(dirname "$DAPHNE_SOCKET"): $lock"
}

check_health_through_caddy() {
    local body="$STATE/health.json" status
    wait_for 60 test "$(https_status /health "$body")" = 200 || fail "https://$DOMAIN/health answered $(https_status /health), not 200: $(journalctl -u caddy -n 3 --no-pager -o cat)"
    status="$(python3 -c 'import json, sys; e = json.load(open(sys.argv[1]))["executor"]; print(e["mode"], e["user"], e["ok"])' "$body")"
    [ "$status" = "service $AGENT True" ] || fail "/health reports the executor as '$status', not 'service $AGENT True'"
    echo "https://$DOMAIN/health through Caddy: 200, executor: $status"
}

check_mcp_exec_as_agent() {
    local who
    who="$(mcp exec 'id -un')" || fail "$who"
    [ "$who" = "$AGENT" ] || fail "terminal_exec ran as '$who', not $AGENT"
    echo "MCP initialize + terminal_exec through Caddy: runs as $who"
}

check_agent_locked_out() {
    local path
    runuser -u "$AGENT" -- ls "$STATE_DIR/" >/dev/null 2>&1 && fail "$AGENT can list $STATE_DIR"
    for path in "$STATE_DIR/sandstorm.sqlite3" "$STATE_DIR/secret_key" "$ENV_FILE"; do
        [ -e "$path" ] || fail "$path does not exist (the check would prove nothing)"
        runuser -u "$AGENT" -- head -c 1 "$path" >/dev/null 2>&1 && fail "$AGENT can read $path"
    done
    can_connect "$AGENT" "$DAPHNE_SOCKET" && fail "$AGENT can connect to $DAPHNE_SOCKET"
    can_connect "$AGENT" "$EXECUTOR_SOCKET" && fail "$AGENT can connect to $EXECUTOR_SOCKET"
    can_connect caddy "$DAPHNE_SOCKET" || fail "caddy cannot connect to $DAPHNE_SOCKET"
    # And from where agents really are: a tool command, in the executor's unit.
    local seen
    seen="$(mcp exec "ls $STATE_DIR/ >/dev/null 2>&1 && echo LISTED $STATE_DIR; head -c 1 $ENV_FILE >/dev/null 2>&1 && echo READ $ENV_FILE; curl -s --max-time 5 --unix-socket $DAPHNE_SOCKET http://x/health >/dev/null && echo REACHED daphne; true")" || fail "$seen"
    [ -z "$seen" ] || fail "a tool command could: $seen"
    echo "$AGENT (shell and terminal_exec): no access to $STATE_DIR, $ENV_FILE, either socket; caddy connects"
}

# From a tool call (terminal_exec through Caddy, as an agent): each TARGET (tcp:HOST:PORT or unix:PATH) is
# connected to; prints one line per target, "REACHED" for each that accepted.
agent_connects() {
    local probe
    probe="$(cat <<'PY'
import socket, sys
for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    if kind == "tcp":
        host, _, port = where.rpartition(":")
        family, address = (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))
    else:
        family, address = socket.AF_UNIX, where
    with socket.socket(family) as probe:
        probe.settimeout(5)
        try:
            probe.connect(address)
        except OSError as error:
            print(target, "not reached:", type(error).__name__)
        else:
            print(target, "REACHED")
PY
)"
    mcp exec "python3 -c '$probe' $*"
}

# No local listener of the installation answers an agent: Caddy's admin API (not on TCP 2019; its socket, which
# root reaches, not for the agent), Daphne's and the executor's sockets.
check_agent_reaches_no_listener() {
    local seen problems=""
    seen="$(agent_connects tcp:127.0.0.1:2019 tcp:::1:2019 "unix:$CADDY_ADMIN_SOCKET" "unix:$EXECUTOR_SOCKET" \
        "unix:$DAPHNE_SOCKET")" || fail "$seen"
    printf '%s\n' "$seen" | sed 's/^/    agent: /'
    grep -q REACHED <<<"$seen" && problems+="a tool call reached: $(grep REACHED <<<"$seen" | tr '\n' ' ')"
    # The admin API is there for root (systemctl reload caddy uses it), on the socket alone.
    [ -S "$CADDY_ADMIN_SOCKET" ] || problems+=" no admin socket $CADDY_ADMIN_SOCKET;"
    [ "$(stat -c '%a %U' "$(dirname "$CADDY_ADMIN_SOCKET")" 2>&1)" = "700 caddy" ] ||
        problems+=" $(dirname "$CADDY_ADMIN_SOCKET") is '$(stat -c '%a %U' "$(dirname "$CADDY_ADMIN_SOCKET")" 2>&1)', not '700 caddy';"
    # (Caddy answers a request on its admin socket only with an empty Host.)
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: ' --unix-socket "$CADDY_ADMIN_SOCKET" http://localhost/config/)" = 200 ] ||
        problems+=" root cannot read Caddy's config on $CADDY_ADMIN_SOCKET;"
    can_connect "$AGENT" "$CADDY_ADMIN_SOCKET" && problems+=" $AGENT can connect to $CADDY_ADMIN_SOCKET;"
    # Nothing listens on port 2019 (07E3), on any address (state 0A: listening).
    [ -z "$(awk '$2 ~ /:07E3$/ && $4 == "0A"' /proc/net/tcp /proc/net/tcp6)" ] || problems+=" something listens on port 2019;"
    [ -z "$problems" ] || fail "$problems"
    # Caddy still reloads (its admin API on the socket), twice, and serves the site throughout.
    systemctl reload caddy.service || fail "systemctl reload caddy: $(journalctl -u caddy -n 5 --no-pager -o cat)"
    systemctl reload caddy.service || fail "a second systemctl reload caddy: $(journalctl -u caddy -n 5 --no-pager -o cat)"
    [ "$(https_status /health)" = 200 ] || fail "/health through Caddy after reloading it: $(https_status /health)"
    echo "no listener reached from a tool call; Caddy's admin API on $CADDY_ADMIN_SOCKET (root: 200); reloaded twice, /health 200"
}

# What a tool call may write: the workspace, and a /tmp and /dev/shm of the executor's own (neither the host's nor the
# server's); not /var/tmp (the state dir's file system), /run/lock, /etc or /usr.
check_agent_writes_only_workspace() {
    local mark="agent-mark-$RANDOM" seen expected problems="" dir server
    # shellcheck disable=SC2016  # $d is the agent's shell's
    seen="$(mcp exec 'for d in /tmp /dev/shm /var/tmp /run/lock /etc /usr '"$WORKSPACE"'; do if touch "$d/'"$mark"'" 2>/dev/null; then echo "$d writable"; else echo "$d read-only"; fi; done')" ||
        fail "$seen"
    printf '%s\n' "$seen" | sed 's/^/    agent: /'
    expected="$(printf '%s\n' '/tmp writable' '/dev/shm writable' '/var/tmp read-only' '/run/lock read-only' \
        '/etc read-only' '/usr read-only' "$WORKSPACE writable")"
    [ "$seen" = "$expected" ] || problems+=" the agent's writable places differ from: $(tr '\n' ',' <<<"$expected");"
    server="$(main_pid "$SERVICE.service")"
    for dir in /tmp /dev/shm /var/tmp /run/lock; do
        [ ! -e "$dir/$mark" ] || problems+=" the agent's $dir/$mark is in the host's $dir;"
        nsenter -t "$server" -m test -e "$dir/$mark" && problems+=" the server sees the agent's $dir/$mark;"
    done
    # Private, not merely unwritable: a later call finds its own files there.
    [ "$(mcp exec "cat /tmp/$mark /dev/shm/$mark && echo kept")" = kept ] || problems+=" a later call lost /tmp/$mark or /dev/shm/$mark;"
    rm -f "$WORKSPACE/$mark"
    [ -z "$problems" ] || fail "$problems"
    echo "a tool call writes the workspace and a /tmp and /dev/shm of its own (not the host's, not the server's), not /var/tmp, /run/lock, /etc, /usr"
}

# Kernel confinement in production: /health says the read sandbox and the `workspace` profile are in force, the
# installation's default stays `host`, and a token set to `workspace` writes only in the workspace and gains no
# privileges (the shim says so), through Caddy as an agent would.
check_confinement_in_production() {
    local body="$STATE/health.json" states seen
    https_status /health "$body" >/dev/null
    states="$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["executor"]["confinement"]; print(c["read"], "|", c["workspace"], "|", c["default_profile"])' "$body")"
    if [ "$states" != "enforced | enforced | host" ]; then
        case "$states" in
            *"no Landlock"* | *"turned off"*) echo "this kernel cannot confine: $states"; exit 77 ;;
        esac
        fail "/health says read | workspace | default: '$states', not 'enforced | enforced | host'"
    fi
    echo "/health: read sandbox and workspace profile enforced; default profile host"
    sandstorm-manage create_token confined-test --confinement workspace 2>/dev/null | tail -n 1 >"$STATE/confined-token"
    [ -s "$STATE/confined-token" ] || fail "create_token --confinement workspace printed no token"
    # shellcheck disable=SC2016  # $HOME is the agent's shell's
    seen="$("$VENV_PY" "$HERE/mcp_check.py" "$DOMAIN" "$CADDY_CA" "$STATE/confined-token" exec \
        'echo x > "$HOME/confined-mark" 2>/dev/null && echo home-written; sudo -n true 2>&1 | head -n 1; echo y > '"$WORKSPACE"'/confined-mark && echo workspace-written')" ||
        fail "$seen"
    rm -f "$WORKSPACE/confined-mark"
    case "$seen" in *home-written*) fail "a workspace-confined call wrote its home: $seen" ;; esac
    case "$seen" in *"this credential is confined to its workspace"*) ;; *) fail "sudo did not say the credential is confined: $seen" ;; esac
    case "$seen" in *workspace-written*) ;; *) fail "a workspace-confined call could not write the workspace: $seen" ;; esac
    echo "a workspace-confined token writes the workspace, not its home; sudo says it is confined"
}

# Revoking a token ends what its commands left running: a terminal_exec whose command started a process in a
# session of its own (setsid) and returned is followed into the credential's cgroup (Delegate=yes), and
# `sandstorm-manage revoke_token` kills it; another token's is left alone.
check_revoke_ends_detached_processes() {
    local body="$STATE/health.json" tracked name pid kept mark="xdet$RANDOM" seen
    https_status /health "$body" >/dev/null
    tracked="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["executor"]["confinement"]["process_groups"])' "$body")"
    [ "$tracked" = tracked ] || fail "/health: processes per credential: '$tracked', not 'tracked'"
    for name in detach-revoked detach-kept; do
        sandstorm-manage create_token "$name" 2>/dev/null | tail -n 1 >"$STATE/$name-token"
        seen="$("$VENV_PY" "$HERE/mcp_check.py" "$DOMAIN" "$CADDY_CA" "$STATE/$name-token" exec \
            "setsid bash -c 'exec -a $mark-$name sleep 283' </dev/null >/dev/null 2>&1 & echo started")" || fail "$seen"
        [ "$seen" = started ] || fail "terminal_exec for $name: $seen"
    done
    wait_for 10 pgrep -f "^$mark-detach-revoked " >/dev/null || fail "the detached process did not start"
    pid="$(pgrep -f "^$mark-detach-revoked ")"
    kept="$(pgrep -f "^$mark-detach-kept ")"
    grep -q '/sandstorm-[0-9a-f]*/cred-' "/proc/$pid/cgroup" || fail "process $pid is not in a credential's cgroup: $(cat "/proc/$pid/cgroup")"
    sandstorm-manage revoke_token detach-revoked >/dev/null
    wait_for 20 sh -c "! kill -0 $pid 2>/dev/null" || fail "process $pid of the revoked token still runs"
    kill -0 "$kept" 2>/dev/null || fail "process $kept of another token was ended"
    kill "$kept"
    echo "revoke_token ended the process its terminal_exec left in a session of its own ($pid); another token's ran on"
}

check_socket_activation() {
    systemctl stop "$EXECUTOR.service"
    systemctl is-active --quiet "$EXECUTOR.service" && fail "$EXECUTOR.service still active after stop"
    local who
    who="$(mcp exec 'id -un')" || fail "after stopping the executor: $who"
    systemctl is-active --quiet "$EXECUTOR.service" || fail "the call did not start $EXECUTOR.service again"
    echo "stopped $EXECUTOR.service; the next terminal_exec started it through its socket (ran as $who)"
}

# A restart of the server refuses no request: while one server stops and the next starts, requests wait in the
# socket's queue (a stopping server neither shuts the socket down nor removes its file), and no unit fails.
check_server_restart_refuses_nothing() {
    local statuses="$STATE/restart-statuses" poller restarts_before codes
    : >"$statuses"
    restarts_before="$(systemctl show -P NRestarts "$SERVICE.service")"
    (
        end=$((SECONDS + 25))
        while [ "$SECONDS" -lt "$end" ]; do
            https_status /health >>"$statuses"
            echo >>"$statuses"
            sleep 0.1
        done
    ) &
    poller=$!
    sleep 3
    systemctl restart "$SERVICE.service"
    wait "$poller"
    codes="$(sort "$statuses" | uniq -c | tr -s ' ' | tr '\n' ';')"
    [ "$(grep -vc '^200$' "$statuses")" -eq 0 ] || fail "requests during the restart were refused: $codes"
    systemctl is-active --quiet "$SERVICE.socket" || fail "$SERVICE.socket is not active after the restart"
    [ "$(systemctl show -P NRestarts "$SERVICE.service")" = "$restarts_before" ] ||
        fail "$SERVICE.service crashed and was restarted by systemd: $(journalctl -u "$SERVICE" -n 20 --no-pager)"
    [ -S "$DAPHNE_SOCKET" ] || fail "$DAPHNE_SOCKET is gone"
    echo "systemctl restart $SERVICE under requests through Caddy: every answer 200 ($codes), the socket kept"
}

check_background_survives_restart() {
    local pid user
    pid="$(mcp background 'sleep 600')" || fail "$pid"
    systemctl restart "$EXECUTOR.service"
    user="$(ps -o user= -p "$pid" || true)"
    [ "$user" = "$AGENT" ] || fail "background process $pid is gone after restarting the executor (user: '$user')"
    mcp kill "$pid" || fail "terminal_kill $pid"
    wait_for 10 sh -c "! kill -0 $pid 2>/dev/null" || fail "process $pid still runs after terminal_kill"
    echo "background process $pid (as $AGENT) survived systemctl restart $EXECUTOR; terminal_kill ended it"
}

# A background command is followed with terminal_output across restarts of both units: its output, state and exit
# code live in its job host and its files, not in either process.
check_background_followed_across_restarts() {
    local pid expected followed
    # shellcheck disable=SC2016  # $i is the agent's shell's
    pid="$(mcp background 'for i in $(seq 1 30); do echo tick $i; sleep 0.2; done; exit 4')" || fail "$pid"
    systemctl restart "$EXECUTOR.service" "$SERVICE.service"
    wait_for 60 curl -fs --max-time 5 -o /dev/null --cacert "$CADDY_CA" "https://$DOMAIN/health" || fail "no /health after the restart"
    followed="$(mcp follow "$pid")" || fail "$followed"
    expected="exited 4 $(for i in $(seq 1 30); do printf 'tick %s ' "$i"; done)"
    [ "$followed" = "${expected% }" ] || fail "followed across restarts: '$followed'"
    echo "background command $pid followed across restarts of $EXECUTOR and $SERVICE: 30 lines, exit code 4"
}

# The toolkit as installed: ripgrep came with the venv (file_grep finds it beside the executor's Python).
check_toolkit_search() {
    local found
    mcp exec 'mkdir -p toolkit && printf "needle in a haystack\n" > toolkit/hay.txt' >/dev/null || fail "writing toolkit/hay.txt"
    found="$(mcp grep 'needle')" || fail "$found"
    case "$found" in *toolkit/hay.txt*) ;; *) fail "file_grep did not find toolkit/hay.txt: $found" ;; esac
    echo "file_grep (the installed venv's rg, as $AGENT) found toolkit/hay.txt"
}

check_timers_services() {
    local name unit out
    # Unset retention: the job stops with one clear line, not an audit_prune with an empty date.
    if systemctl start "$SERVICE-audit-prune.service" 2>/dev/null; then
        fail "$SERVICE-audit-prune.service succeeded without SANDSTORM_AUDIT_RETENTION_DAYS"
    fi
    out="$(journalctl -u "$SERVICE-audit-prune.service" --no-pager -o cat | grep -c 'SANDSTORM_AUDIT_RETENTION_DAYS is not set' || true)"
    [ "$out" -ge 1 ] || fail "no clear line from $SERVICE-audit-prune.service without a retention: $(journalctl -u "$SERVICE-audit-prune.service" -n 5 --no-pager -o cat)"
    # (audit_prune given an empty date would answer with its usage and "error: argument --before".)
    journalctl -u "$SERVICE-audit-prune.service" --no-pager -o cat | grep -qE 'Traceback|error: argument|usage: manage.py' &&
        fail "audit_prune ran without a retention: $(journalctl -u "$SERVICE-audit-prune.service" -n 5 --no-pager -o cat)"
    echo "without SANDSTORM_AUDIT_RETENTION_DAYS: $SERVICE-audit-prune.service stops with one line"
    echo 'SANDSTORM_AUDIT_RETENTION_DAYS=365' >>"$ENV_FILE"
    install /root/sandstorm >/dev/null || fail "install.sh after setting a retention"
    systemctl is-enabled --quiet "$SERVICE-audit-prune.timer" || fail "the installer did not enable the audit-prune timer"
    for name in "${TIMERS[@]}"; do
        unit="$SERVICE-$name"
        systemctl is-active --quiet "$unit.timer" || fail "$unit.timer is $(systemctl is-active "$unit.timer")"
        systemctl start "$unit.service" || fail "$unit.service: $(journalctl -u "$unit.service" -n 5 --no-pager -o cat)"
        [ "$(systemctl show -P Result "$unit.service")" = success ] || fail "$unit.service: $(systemctl show -P Result "$unit.service")"
    done
    echo "ran once, each successfully: ${TIMERS[*]/#/$SERVICE-}"
}

record_pids() { local u; for u in "$SERVICE.service" "$EXECUTOR.service" caddy.service; do echo "$u $(main_pid "$u")"; done; }

check_second_install_changes_nothing() {
    record_pids >"$STATE/pids.before"
    install /root/sandstorm >/dev/null || fail "the second install run failed"
    record_pids >"$STATE/pids.after"
    diff "$STATE/pids.before" "$STATE/pids.after" || fail "a second install run restarted something (pids above)"
    echo "second run: same pids ($(tr '\n' ' ' <"$STATE/pids.after"))"
}

check_executor_limits() {
    local shown
    shown="$(systemctl show -p TasksMax -p MemoryHigh -p MemoryMax "$EXECUTOR.service" | tr '\n' ' ')"
    echo "defaults: $shown"
    [[ "$shown" == *"TasksMax=4096 "* ]] || fail "TasksMax is not the default 4096: $shown"
    [[ "$shown" != *"MemoryMax=infinity"* && "$shown" != *"MemoryHigh=infinity"* ]] || fail "no memory limit: $shown"
    # A changed value in the env file is re-rendered by the next install run.
    printf 'SANDSTORM_EXECUTOR_TASKS_MAX=80\nSANDSTORM_EXECUTOR_MEMORY_MAX=1G\n' >>"$ENV_FILE"
    install /root/sandstorm >/dev/null || fail "install.sh after changing the limits"
    shown="$(systemctl show -p TasksMax -p MemoryMax "$EXECUTOR.service" | tr '\n' ' ')"
    [ "$shown" = "MemoryMax=1073741824 TasksMax=80 " ] || fail "after SANDSTORM_EXECUTOR_TASKS_MAX=80, MEMORY_MAX=1G: $shown"
    echo "after changing the env file and rerunning the installer: $shown"
}

# A fork flood, bounded in count and time, as the agent through terminal_exec: it must hit TasksMax (fork fails)
# while the server keeps answering through Caddy.
check_fork_flood_stops_at_tasks_max() {
    local flood out pids_max
    # Where the kernel enforces TasksMax: the unit's pids.max (cgroup v2, or the v1 pids hierarchy). A container on
    # a cgroup v1 host gets that hierarchy read-only, so its systemd cannot set it: say so, loudly, rather than pass.
    pids_max="$(cat "/sys/fs/cgroup/system.slice/$EXECUTOR.service/pids.max" \
        "/sys/fs/cgroup/pids/system.slice/$EXECUTOR.service/pids.max" 2>/dev/null | head -n 1 || true)"
    if [ "$pids_max" != 80 ]; then
        echo "SKIPPED: the kernel does not enforce TasksMax here (the unit's pids.max is '${pids_max:-missing}': no pids controller for this container's systemd); systemctl show checked it above"
        exit 77
    fi
    flood="$(cat <<'PY'
import os, signal, sys, time
children = []
refused = None
for _ in range(400):
    try:
        pid = os.fork()
    except BlockingIOError:
        refused = len(children)
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    children.append(pid)
if refused is not None:
    open("flood-holding", "w").close()
    time.sleep(4)
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)
print(f"fork refused after {refused} children" if refused is not None else f"no limit: {len(children)} children")
PY
)"
    rm -f "/home/$AGENT/workspace/flood-holding"
    mcp exec "python3 -c '$flood'" >"$STATE/flood.out" 2>&1 &
    local caller=$!
    wait_for 30 test -e "/home/$AGENT/workspace/flood-holding" || { wait "$caller" || true; fail "the flood did not hit TasksMax: $(cat "$STATE/flood.out")"; }
    local status
    status="$(https_status /health)"
    wait "$caller" || fail "the flood call failed: $(cat "$STATE/flood.out")"
    out="$(cat "$STATE/flood.out")"
    [[ "$out" == "fork refused after "* ]] || fail "flood: $out"
    [ "$status" = 200 ] || fail "/health answered $status during the flood"
    systemctl is-active --quiet "$EXECUTOR.service" || fail "the executor died in the flood"
    echo "fork flood as $AGENT: $out (TasksMax=80); /health through Caddy during it: $status; executor still active"
}

# Does UNIT run a main process other than PID (restarted)?
restarted() {
    local pid
    pid="$(main_pid "$1")"
    [ "$pid" != 0 ] && [ "$pid" != "$2" ]
}

# Does worker N answer /health with 200 on its socket?
worker_healthy() {
    [ "$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "/run/sandstorm-mcp/worker-$1.sock" "http://$DOMAIN/health")" = 200 ]
}

# The warnings and errors the workers logged since the last start (JSON lines: level and message).
workers_log_problems() {
    journalctl -u "$SERVICE.service" -u "$SERVICE-worker@2.service" -u "$SERVICE-redis.service" --since "-2min" \
        --no-pager -o cat | grep -E '"level": "(WARNING|ERROR)"' | cut -c1-400 | tail -n 12
}

# Several workers (docs/scaling.md), as an admin sets them up on a new host: PostgreSQL first (the Debian package,
# a role and a database, reached on its Unix socket with peer authentication: the role is the server's OS user),
# DATABASE_URL in the env file, then `install.sh --workers 2`, which installs Redis as a
# service of Sandstorm's own. The SQLite installation's state and env file are set aside (a new host's are empty).
check_workers() {
    local log="$STATE/install-workers.log" number unit before
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >"$STATE/apt-pg.log" 2>&1 ||
        fail "apt-get install postgresql: $(tail -n 3 "$STATE/apt-pg.log")"
    # On its Unix socket alone: the container shares the host's network, where port 5432 may be taken.
    printf "listen_addresses = ''\n" >>"$(find /etc/postgresql -name postgresql.conf | head -n 1)"
    systemctl restart postgresql.service
    wait_for 60 runuser -u postgres -- psql -qAtc 'SELECT 1' >/dev/null 2>&1 || fail "PostgreSQL did not start"
    # Its port names its socket: the package takes the next free one where the host's PostgreSQL has 5432.
    local port
    port="$(pg_lsclusters --no-header | awk 'NR == 1 { print $3 }')"
    (cd / && runuser -u postgres -- psql -q -c "CREATE ROLE sandstorm LOGIN" \
        -c "CREATE DATABASE sandstorm OWNER sandstorm") || fail "could not create the role and database"
    systemctl stop "$SERVICE.service" "$SERVICE.socket"
    mv "$STATE_DIR" "$STATE_DIR.sqlite"
    mv "$ENV_FILE" "$ENV_FILE.sqlite"
    printf '%s\n' "SANDSTORM_PUBLIC_URL=https://$DOMAIN" "SANDSTORM_WORKSPACE_ROOT=/home/$AGENT/workspace" \
        "SANDSTORM_STATE_DIR=$STATE_DIR" "DATABASE_URL=postgres://sandstorm@:$port/sandstorm?host=/run/postgresql" >"$ENV_FILE"
    chmod 0600 "$ENV_FILE"
    if ! (cd /root/sandstorm && SANDSTORM_DOMAIN="$DOMAIN" bash deploy/install.sh --workers 2) >"$log" 2>&1; then
        tail -n 25 "$log"
        fail "install.sh --workers 2 failed"
    fi
    grep -E '^(==>|install.sh: warning)|worker' "$log" | sed 's/^/    /' | tail -n 30
    for unit in "$SERVICE.service" "$SERVICE-worker@2.service" "$SERVICE-worker@2.socket" "$SERVICE-redis.service"; do
        systemctl is-active --quiet "$unit" || fail "$unit is $(systemctl is-active "$unit")"
    done
    systemctl is-active --quiet redis-server.service && fail "Debian's own redis-server.service runs (open to every local user)"
    can_connect "$AGENT" /run/sandstorm-mcp-redis/redis.sock && fail "$AGENT can connect to Sandstorm's Redis"
    can_connect caddy /run/sandstorm-mcp-redis/redis.sock && fail "caddy can connect to Sandstorm's Redis"
    for number in 1 2; do
        can_connect caddy "/run/sandstorm-mcp/worker-$number.sock" || fail "caddy cannot connect to worker $number"
        can_connect "$AGENT" "/run/sandstorm-mcp/worker-$number.sock" && fail "$AGENT can connect to worker $number"
    done
    echo "active: $SERVICE.service, $SERVICE-worker@2 (socket and service), $SERVICE-redis; Redis: the server's user alone"
    # Sessions through Caddy, open at once: new ones are spread over the workers, and every call of each reaches the
    # worker holding it (another worker would answer 404).
    sandstorm-manage create_token workers-test 2>/dev/null | tail -n 1 >"$STATE/token"
    # From a tool call: neither Redis (its socket, Debian's port), nor worker 2, nor PostgreSQL (no TCP; on its
    # socket, peer authentication refuses the agent the server's role).
    local seen
    seen="$(agent_connects unix:/run/sandstorm-mcp-redis/redis.sock tcp:127.0.0.1:6379 unix:/run/sandstorm-mcp/worker-2.sock \
        "tcp:127.0.0.1:$port")" || fail "$seen"
    grep -q REACHED <<<"$seen" && fail "a tool call reached: $seen"
    seen="$(mcp exec "psql -h /run/postgresql -p $port -U sandstorm -d sandstorm -Atc 'SELECT 1' 2>&1; echo exit=\$?")" || fail "$seen"
    [[ "$seen" == *"Peer authentication failed"*"exit=2" ]] || fail "psql as the server's role from a tool call: $seen"
    echo "from a tool call: Redis, worker 2 and PostgreSQL's port not reached; its socket refuses the server's role"
    local tags
    tags="$(mcp sessions 4)" || fail "sessions through Caddy: $tags $(workers_log_problems)"
    [[ " $tags " == *" w1 "* && " $tags " == *" w2 "* ]] || fail "4 sessions through Caddy, not on both workers: $tags"
    echo "4 sessions through Caddy at once, on workers $tags, 3 calls each"
    # One restart restarts every worker (PartOf=).
    before="$(main_pid "$SERVICE-worker@2.service")"
    systemctl restart "$SERVICE.service"
    wait_for 30 restarted "$SERVICE-worker@2.service" "$before" || fail "systemctl restart $SERVICE did not restart worker 2"
    for number in 1 2; do
        wait_for 60 worker_healthy "$number" || fail "worker $number is not back after the restart: $(workers_log_problems)"
    done
    [ "$(mcp exec 'echo after-restart')" = after-restart ] ||
        fail "no session through Caddy after the restart: $(workers_log_problems)"
    echo "systemctl restart $SERVICE restarted worker 2 too"
    # A rerun without --workers keeps two; --workers 1 goes back to one, and removes what the second needed.
    (cd /root/sandstorm && SANDSTORM_DOMAIN="$DOMAIN" bash deploy/install.sh) >"$log" 2>&1 || { tail -n 25 "$log"; fail "rerun"; }
    systemctl is-enabled --quiet "$SERVICE-worker@2.service" || fail "a rerun without --workers dropped worker 2"
    (cd /root/sandstorm && SANDSTORM_DOMAIN="$DOMAIN" bash deploy/install.sh --workers 1) >"$log" 2>&1 ||
        { tail -n 25 "$log"; fail "install.sh --workers 1"; }
    for unit in "$SERVICE-worker@2.service" "$SERVICE-worker@2.socket" "$SERVICE-redis.service"; do
        systemctl is-active --quiet "$unit" && fail "$unit still runs with one worker"
    done
    [ ! -e /etc/systemd/system/sandstorm-mcp-redis.service ] || fail "the Redis unit is still installed with one worker"
    grep -q 'worker-2.sock' /etc/caddy/sandstorm-mcp.caddy && fail "Caddy still proxies to worker 2"
    [ "$(mcp exec 'echo one-worker')" = one-worker ] || fail "no session through Caddy with one worker"
    echo "a rerun kept 2 workers; --workers 1 stopped worker 2 and Redis, and Caddy proxies to worker 1 alone"
}

check_name() { declare -F "check_$1" >/dev/null; }

if [ $# -ne 1 ] || ! check_name "$1"; then
    echo "usage: checks.sh NAME (one of: $(declare -F | sed -n 's/^declare -f check_//p' | grep -v '^name$' | tr '\n' ' '))" >&2
    exit 2
fi
"check_$1"
