#!/usr/bin/env bash
# Install or upgrade Sandstorm on a Debian or Ubuntu host: Daphne under systemd, behind Caddy with automatic HTTPS.
#
#   SANDSTORM_DOMAIN=mcp.example.com bash deploy/install.sh [--dry-run] [--agent-sudo] [--workers N]
#
# Run it from a git checkout, as root or as a user who can use sudo. Re-running it after `git pull` is the upgrade:
# it changes only what is not already right, keeps data and secrets, and updates code, dependencies and the
# database schema. See `--help` and docs/operations.md.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: SANDSTORM_DOMAIN=mcp.example.com bash deploy/install.sh [--dry-run] [--agent-sudo] [--workers N]

Installs or upgrades Sandstorm: packages, the `sandstorm` and agent users, the code in /opt/sandstorm-mcp, the
configuration /etc/sandstorm-mcp.env (written once, never overwritten), the systemd services (the server, as
`sandstorm`, and the tool executor, as the agent user) and timers, the Caddy site for SANDSTORM_DOMAIN; then
migrates the database and smoke-tests the server.

  --dry-run     print what would be done, change nothing
  --agent-sudo  let tools install distribution packages (workspace_install with apt) through sudo; this lets
                whoever holds a full-scope token become root. A later run without it removes that permission.
  --workers N   run N server processes behind Caddy (docs/scaling.md); more than one need PostgreSQL
                (DATABASE_URL in the env file) and Redis (SANDSTORM_REDIS_URL there, or else Debian's
                redis-server run as a service of Sandstorm's own). A later run without it keeps the number.

Environment: SANDSTORM_DOMAIN (required), SANDSTORM_AGENT_USER (default sandstorm-agent),
SANDSTORM_ADMIN_PASSWORD (first install only; default: generated and printed once),
SANDSTORM_HTTPS_WAIT (seconds the smoke test waits for Caddy's HTTPS, default 120),
SANDSTORM_PREFIX (install under this directory instead of /, for tests).
EOF
}

# --- where everything goes (all under SANDSTORM_PREFIX, so tests can install into a throwaway root) ------------
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${SANDSTORM_PREFIX:-}"
PREFIX="${PREFIX%/}"
SERVICE="sandstorm-mcp"
EXECUTOR="$SERVICE-executor"
SERVICE_USER="sandstorm"
AGENT_USER="${SANDSTORM_AGENT_USER:-sandstorm-agent}"
CADDY_GROUP="caddy"
CADDY_USER="caddy"
# Where Caddy keeps its local CA (the issuer of certificates for *.localhost and other internal names).
CADDY_LOCAL_ROOT="$PREFIX/var/lib/caddy/.local/share/caddy/pki/authorities/local/root.crt"
APP_ROOT="$PREFIX/opt/$SERVICE"
APP_DIR="$APP_ROOT/app"
VENV="$APP_ROOT/venv"
STATE_DIR="$PREFIX/var/lib/$SERVICE"
BACKUP_DIR="$STATE_DIR/backups"
AGENT_HOME="$PREFIX/home/$AGENT_USER"
WORKSPACE="$AGENT_HOME/workspace"
ENV_FILE="$PREFIX/etc/$SERVICE.env"
# Optional, the admin's: what tool processes may get (SANDSTORM_TOOL_ENV_ALLOW and its variables); never written here.
EXECUTOR_ENV_FILE="$PREFIX/etc/$EXECUTOR.env"
RUN_DIR="$PREFIX/run/$SERVICE"
SOCKET="$RUN_DIR/worker-1.sock"  # systemd's (sandstorm-mcp.socket), handed to Daphne: worker 1's
# Workers 2..N (--workers): instances of a template unit, each on RUN_DIR/worker-N.sock, part of $SERVICE.service.
WORKER_UNIT="$SERVICE-worker"
MAX_WORKERS=64
# Redis of Sandstorm's own, for several workers when the env file names none: a Unix socket only the server's user
# may reach, nothing kept on disk.
REDIS_UNIT="$SERVICE-redis"
REDIS_RUN_DIR="$PREFIX/run/$REDIS_UNIT"
# The directory of the executor's socket (systemd's: sandstorm-mcp-executor.socket); the server's unit, the
# maintenance units and sandstorm-manage point at the socket in it.
EXECUTOR_RUN_DIR="$PREFIX/run/$EXECUTOR"
UNIT_DIR="$PREFIX/etc/systemd/system"
DROP_IN="$UNIT_DIR/$EXECUTOR.service.d/agent-sudo.conf"
# The executor's resource limits, rendered from SANDSTORM_EXECUTOR_* in the env file (systemd reads no unit
# setting from an EnvironmentFile).
LIMITS_DROP_IN="$UNIT_DIR/$EXECUTOR.service.d/limits.conf"
# The rule for RUN_DIR, Daphne's socket's directory (0750, the server's user and Caddy's group).
TMPFILES_CONF="$PREFIX/etc/tmpfiles.d/$SERVICE.conf"
SUDOERS_FILE="$PREFIX/etc/sudoers.d/$SERVICE"
CADDY_DIR="$PREFIX/etc/caddy"
CADDY_SITE="$CADDY_DIR/$SERVICE.caddy"
# Caddy's admin API: on this socket (the main Caddyfile's global options), in a directory Caddy's user alone may
# enter (the drop-in's RuntimeDirectory=caddy), never on localhost:2019, where every local user, agents included,
# could rewrite Caddy's configuration.
CADDY_ADMIN_SOCKET="$PREFIX/run/caddy/admin.sock"
CADDY_DROP_IN="$UNIT_DIR/caddy.service.d/$SERVICE.conf"
MANAGE="$PREFIX/usr/local/bin/sandstorm-manage"
OS_RELEASE="$PREFIX/etc/os-release"
PACKAGES=(python3 python3-venv git caddy curl)
# What the server reads from the env file and the installer cannot do without; a file that lacks one of these (an
# operator's edit) gets a warning.
REQUIRED_VARS=(SANDSTORM_PUBLIC_URL SANDSTORM_WORKSPACE_ROOT SANDSTORM_STATE_DIR)
MAX_REQUEST_BYTES=4194304  # SANDSTORM_MAX_REQUEST_BYTES unless the env file sets it
READY_DEADLINE=60
# Caddy may first have to get a certificate (ACME) before it answers over HTTPS.
HTTPS_DEADLINE="${SANDSTORM_HTTPS_WAIT:-120}"
# The executor's limits unless the env file sets them: a fork flood or a memory hog an agent starts stops there.
DEFAULT_TASKS_MAX=4096
DEFAULT_MEMORY_HIGH=75%
DEFAULT_MEMORY_MAX=85%

DRY_RUN=0
AGENT_SUDO=0
WORKERS=""       # --workers N; else the number the installed units run (1 on a first install)
OWN_REDIS=0      # several workers and no SANDSTORM_REDIS_URL in the env file
UNIT_REDIS_URL=""
SUDO=()
# What this run changed, to restart or reload only what needs it.
CHANGED_CODE=0
CHANGED_UNITS=0
CHANGED_CONFIG=0
CHANGED_CADDY=0
CHANGED_CADDY_ADMIN=0  # the admin address or its directory changed: a reload cannot move it, a restart does
CHANGED_SOCKET=0
CHANGED_SERVER_SOCKET=0
CHANGED_REDIS=0
FIRST_INSTALL=0

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }
die() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 1
}

# Run a command as root (through sudo unless we are root), or only print it in a dry run.
run() {
    if [ "$DRY_RUN" -eq 1 ]; then
        printf '    would run: %s\n' "$*"
        return 0
    fi
    as_root "$@"
}

# Read-only commands that need root (reading root's files) run even in a dry run.
as_root() {
    if [ ${#SUDO[@]} -eq 0 ]; then
        "$@"
    else
        "${SUDO[@]}" "$@"
    fi
}

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --dry-run) DRY_RUN=1 ;;
            --agent-sudo) AGENT_SUDO=1 ;;
            --workers)
                [ $# -ge 2 ] || die "--workers needs a number (see --help)"
                WORKERS="$2"
                shift
                ;;
            --workers=*) WORKERS="${1#--workers=}" ;;
            -h | --help)
                usage
                exit 0
                ;;
            *) die "unknown option '$1' (see --help)" ;;
        esac
        shift
    done
    if [ -n "$WORKERS" ] && ! { [[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] && [ "$WORKERS" -le "$MAX_WORKERS" ]; }; then
        die "--workers must be a number from 1 to $MAX_WORKERS, not '$WORKERS'"
    fi
}

# --- refusals: each says what to do ----------------------------------------------------------------------------
check_domain() {
    local domain="${SANDSTORM_DOMAIN:-}"
    if [ -z "$domain" ]; then
        die "SANDSTORM_DOMAIN is not set. Run: SANDSTORM_DOMAIN=mcp.example.com bash deploy/install.sh (the public DNS name of this host, which must already point at it for HTTPS)"
    fi
    local label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
    if ! [[ "$domain" =~ ^$label(\.$label)+$ ]]; then
        die "SANDSTORM_DOMAIN must be a DNS name such as mcp.example.com (no scheme, port or path), not '$domain'"
    fi
    DOMAIN="${domain,,}"
    PUBLIC_URL="https://$DOMAIN"
}

# The value of KEY in an os-release file, without sourcing it.
os_release_value() {
    local key="$1" line
    while IFS= read -r line; do
        if [[ "$line" == "$key="* ]]; then
            line="${line#"$key="}"
            line="${line#\"}"
            printf '%s' "${line%\"}"
            return 0
        fi
    done <"$OS_RELEASE"
}

check_os() {
    [ -r "$OS_RELEASE" ] || die "cannot read $OS_RELEASE: this installer supports Debian 12 and 13 and Ubuntu 24.04 or newer"
    local id version name supported=0
    id="$(os_release_value ID)"
    version="$(os_release_value VERSION_ID)"
    name="$(os_release_value PRETTY_NAME)"
    case "$id" in
        debian) [[ "$version" == 12 || "$version" == 13 ]] && supported=1 ;;
        ubuntu)
            local major="${version%%.*}" minor="${version#*.}"
            if [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] && ((10#$major * 100 + 10#$minor >= 2404)); then
                supported=1
            fi
            ;;
    esac
    if [ "$supported" -ne 1 ]; then
        die "unsupported system: ${name:-$id $version}. This installer supports Debian 12 and 13 and Ubuntu 24.04 or newer."
    fi
    note "system: $name"
}

check_privileges() {
    if [ "$(id -u)" -eq 0 ]; then
        return 0
    fi
    if ! command -v sudo >/dev/null 2>&1; then
        die "this installer needs root privileges, and sudo is not installed: run it as root, or install sudo and add your user to the sudo group"
    fi
    if ! sudo -v; then
        die "this installer needs root privileges: run it as a user who may use sudo (or as root)"
    fi
    SUDO=(sudo --)
}

# --- files -------------------------------------------------------------------------------------------------------
# A template with its @NAME@ placeholders filled in, on stdout.
render() {
    local text
    text="$(<"$1")"
    text="${text//@APP_DIR@/$APP_DIR}"
    text="${text//@VENV@/$VENV}"
    text="${text//@STATE_DIR@/$STATE_DIR}"
    text="${text//@ENV_FILE@/$ENV_FILE}"
    text="${text//@RUN_DIR@/$RUN_DIR}"
    text="${text//@EXECUTOR_RUN_DIR@/$EXECUTOR_RUN_DIR}"
    text="${text//@EXECUTOR_ENV_FILE@/$EXECUTOR_ENV_FILE}"
    text="${text//@WORKSPACE@/$WORKSPACE}"
    text="${text//@SERVICE_USER@/$SERVICE_USER}"
    text="${text//@AGENT_USER@/$AGENT_USER}"
    text="${text//@AGENT_HOME@/$AGENT_HOME}"
    text="${text//@CADDY_GROUP@/$CADDY_GROUP}"
    text="${text//@SITE_ADDRESS@/$DOMAIN}"
    text="${text//@MAX_REQUEST_BYTES@/$MAX_REQUEST_BYTES}"
    # The workers Caddy balances over and routes sessions to (docs/scaling.md), and the worker a unit runs.
    text="${text//@WORKER_NUMBERS@/$(seq -s '|' 1 "${WORKERS:-1}")}"
    text="${text//@UPSTREAMS@/$(upstreams)}"
    text="${text//@WORKERS@/${WORKERS:-1}}"
    text="${text//@WORKER@/${WORKER:-1}}"
    text="${text//@SOCKET_UNIT@/${SOCKET_UNIT:-$SERVICE.socket}}"
    text="${text//@REDIS_URL@/$UNIT_REDIS_URL}"
    text="${text//@REDIS_RUN_DIR@/$REDIS_RUN_DIR}"
    text="${text//@TASKS_MAX@/${TASKS_MAX:-}}"
    text="${text//@MEMORY_HIGH@/${MEMORY_HIGH:-}}"
    text="${text//@MEMORY_MAX@/${MEMORY_MAX:-}}"
    printf '%s\n' "$text"
}

worker_socket() { printf '%s/worker-%s.sock' "$RUN_DIR" "$1"; }

upstreams() {
    local number
    for number in $(seq 1 "${WORKERS:-1}"); do
        printf 'unix/%s ' "$(worker_socket "$number")"
    done | sed 's/ $//'
}

# Install the content of SOURCE at DEST with MODE and OWNER, only if it differs (content or mode): an unchanged
# file is not rewritten, so its timestamp and the services that read it are left alone. Returns 0 if it changed.
put_file() {
    local source="$1" dest="$2" mode="$3" owner="$4"
    if as_root test -f "$dest" && as_root cmp -s "$source" "$dest" &&
        [ "$(as_root stat -c %a "$dest")" = "${mode#0}" ]; then
        return 1
    fi
    if [ "$DRY_RUN" -eq 1 ]; then
        if as_root test -e "$dest"; then note "would update $dest"; else note "would create $dest"; fi
        return 0
    fi
    as_root mkdir -p "$(dirname "$dest")"
    as_root install -m "$mode" "$source" "$dest"
    ensure_owner "$dest" "$owner"
    note "wrote $dest"
    return 0
}

# put_file for a template rendered to a temporary file.
put_rendered() {
    local template="$1" dest="$2" mode="$3" owner="$4" rendered
    rendered="$(mktemp)"
    render "$template" >"$rendered"
    local status=0
    put_file "$rendered" "$dest" "$mode" "$owner" || status=$?
    rm -f "$rendered"
    return "$status"
}

remove_file() {
    as_root test -e "$1" || return 1
    run rm -f "$1"
    return 0
}

ensure_owner() {
    local path="$1" owner="$2"
    [ "$(as_root stat -c %U:%G "$path")" = "$owner" ] || run chown "$owner" "$path"
}

# MODE is octal (0750). chmod gets it with one more leading zero (00750): for a directory, GNU chmod keeps a
# setgid bit that a plain 0750 does not mention, and mkdir under a setgid parent makes the directory setgid.
ensure_dir() {
    local path="$1" mode="$2" owner="$3" want
    want="$(printf '%o' "$((8#$mode))")"
    if ! as_root test -d "$path"; then
        run mkdir -p "$path"
        run chmod "0$mode" "$path"
        run chown "$owner" "$path"
        return 0
    fi
    [ "$(as_root stat -c %a "$path")" = "$want" ] || run chmod "0$mode" "$path"
    ensure_owner "$path" "$owner"
}

# --- steps -------------------------------------------------------------------------------------------------------
install_packages() {
    say "Packages"
    local wanted=("${PACKAGES[@]}") missing=() package
    [ "$AGENT_SUDO" -eq 1 ] && wanted+=(sudo)
    for package in "${wanted[@]}"; do
        if [ "$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)" != "installed" ]; then
            missing+=("$package")
        fi
    done
    if [ ${#missing[@]} -eq 0 ]; then
        note "already installed: ${wanted[*]}"
    else
        run apt-get update -qq
        run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
    if [ "$DRY_RUN" -eq 0 ] && ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        die "Sandstorm needs Python 3.11 or newer; python3 is $(python3 --version 2>&1)"
    fi
}

user_exists() { getent passwd "$1" >/dev/null 2>&1; }

ensure_users() {
    say "Users"
    if ! user_exists "$SERVICE_USER"; then
        run useradd --system --user-group --home-dir "$STATE_DIR" --no-create-home \
            --shell /usr/sbin/nologin --comment "Sandstorm MCP server" "$SERVICE_USER"
    fi
    # The agent user owns the workspace and runs the tools (the executor's unit); it has a shell because tools are
    # shell commands, and no access to the state dir.
    if ! user_exists "$AGENT_USER"; then
        run useradd --system --user-group --home-dir "$AGENT_HOME" --no-create-home \
            --shell /bin/bash --comment "Sandstorm agent (runs tools)" "$AGENT_USER"
    fi
    if [ "$DRY_RUN" -eq 0 ] && ! getent group "$CADDY_GROUP" >/dev/null; then
        die "the group '$CADDY_GROUP' does not exist; the caddy package should have created it (is caddy installed?)"
    fi
    note "server: $SERVICE_USER, agent: $AGENT_USER"
}

ensure_dirs() {
    say "Directories"
    ensure_dir "$STATE_DIR" 0700 "$SERVICE_USER:$SERVICE_USER"
    ensure_dir "$BACKUP_DIR" 0700 "$SERVICE_USER:$SERVICE_USER"
    ensure_dir "$AGENT_HOME" 0750 "$AGENT_USER:$AGENT_USER"
    # The agent's alone: only the executor, running as the agent user, works in it.
    ensure_dir "$WORKSPACE" 0750 "$AGENT_USER:$AGENT_USER"
    ensure_dir "$APP_ROOT" 0755 root:root
}

git_repo() { git -c safe.directory="$REPO" -C "$REPO" "$@"; }

# The code is the repository's committed HEAD, copied to APP_DIR (root's: the server cannot rewrite its own code).
# Decided before anything changes, so the server can be stopped first when an upgrade is coming.
plan_code() {
    say "Code"
    REVISION="$(git_repo rev-parse HEAD 2>/dev/null)" ||
        die "$REPO is not a git checkout: clone the repository and run deploy/install.sh from it"
    if [ -n "$(git_repo status --porcelain --untracked-files=no)" ]; then
        warn "$REPO has uncommitted changes; they are not installed (the installer installs the committed HEAD)"
    fi
    local installed
    installed="$(as_root cat "$APP_DIR/.sandstorm-revision" 2>/dev/null || true)"
    if [ "$REVISION" = "$installed" ]; then
        note "up to date at ${REVISION:0:12}"
    else
        installed="${installed:0:12}"
        note "to install: ${REVISION:0:12} (installed: ${installed:-none})"
        CHANGED_CODE=1
    fi
}

install_code() {
    [ "$CHANGED_CODE" -eq 1 ] || return 0
    if [ "$DRY_RUN" -eq 1 ]; then
        note "would copy ${REVISION:0:12} to $APP_DIR"
        return 0
    fi
    local staging="$APP_ROOT/app.new"
    as_root rm -rf "$staging" "$APP_ROOT/app.old"
    as_root mkdir -m 0755 "$staging"
    git_repo -c tar.umask=0022 archive --format=tar HEAD | as_root tar -x --no-same-owner -C "$staging"
    printf '%s\n' "$REVISION" | as_root tee "$staging/.sandstorm-revision" >/dev/null
    # The server's user cannot write here, so compile now rather than at every start (same python3 as the venv).
    as_root python3 -m compileall -q "$staging" >/dev/null
    if as_root test -d "$APP_DIR"; then
        as_root mv "$APP_DIR" "$APP_ROOT/app.old"
    fi
    as_root mv "$staging" "$APP_DIR"
    as_root rm -rf "$APP_ROOT/app.old"
    note "installed ${REVISION:0:12} in $APP_DIR"
}

# Dependencies from pyproject.toml, pinned by requirements.lock; reinstalled only when either file changed.
install_venv() {
    say "Python environment"
    if ! as_root test -x "$VENV/bin/python"; then
        run python3 -m venv "$VENV"
        CHANGED_CODE=1
    fi
    local extras=() stamp
    if env_file_value DATABASE_URL >/dev/null; then extras+=(postgres); fi
    stamp="$(git_repo show HEAD:pyproject.toml HEAD:requirements.lock | sha256sum | cut -d' ' -f1) ${extras[*]}"
    if [ "$(as_root cat "$VENV/.sandstorm-deps" 2>/dev/null || true)" = "$stamp" ]; then
        note "dependencies up to date"
        return 0
    fi
    if [ "$DRY_RUN" -eq 1 ]; then
        note "would install the dependencies of pyproject.toml, pinned by requirements.lock, into $VENV"
        return 0
    fi
    CHANGED_CODE=1
    local requirements="$VENV/sandstorm-requirements.txt"
    as_root "$VENV/bin/python" -c '
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = project["dependencies"] + [d for extra in sys.argv[3:] for d in project["optional-dependencies"][extra]]
open(sys.argv[2], "w").write("\n".join(wanted) + "\n")' "$APP_DIR/pyproject.toml" "$requirements" "${extras[@]}"
    as_root "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input \
        --constraint "$APP_DIR/requirements.lock" --requirement "$requirements"
    printf '%s\n' "$stamp" | as_root tee "$VENV/.sandstorm-deps" >/dev/null
    note "dependencies installed"
}

# The value of KEY in the env file (exit 1 if unset or empty).
env_file_value() {
    local line
    as_root test -f "$ENV_FILE" || return 1
    line="$(as_root grep -E "^[[:space:]]*$1=" "$ENV_FILE" | tail -n 1)" || return 1
    line="${line#*=}"
    line="${line#\"}"
    line="${line%\"}"
    [ -n "$line" ] || return 1
    printf '%s\n' "$line"
}

write_env_file() {
    say "Configuration"
    if as_root test -f "$ENV_FILE"; then
        note "keeping $ENV_FILE (never overwritten)"
        check_env_file
        return 0
    fi
    FIRST_INSTALL=1
    CHANGED_CONFIG=1
    local draft
    draft="$(mktemp)"
    cat >"$draft" <<EOF
# Sandstorm's configuration, read by the service (EnvironmentFile=) and by sandstorm-manage.
# Written once by deploy/install.sh, which never overwrites it. Every variable: $APP_DIR/deploy/env.example.
# Django's secret key and the audit key are generated files in the state dir, not here.
SANDSTORM_PUBLIC_URL=$PUBLIC_URL
SANDSTORM_WORKSPACE_ROOT=$WORKSPACE
SANDSTORM_STATE_DIR=$STATE_DIR
# Keep audit records this many days (a daily timer prunes older ones); unset keeps them forever.
#SANDSTORM_AUDIT_RETENTION_DAYS=365
EOF
    put_file "$draft" "$ENV_FILE" 0600 root:root || true
    rm -f "$draft"
}

check_env_file() {
    local mode name url
    mode="$(as_root stat -c %a "$ENV_FILE")"
    if [ "$mode" != 600 ]; then
        warn "$ENV_FILE had mode $mode; it holds secrets, so it is set to 0600"
        run chmod 0600 "$ENV_FILE"
    fi
    for name in "${REQUIRED_VARS[@]}"; do
        env_file_value "$name" >/dev/null || warn "$ENV_FILE does not set $name, which this version needs (see deploy/env.example)"
    done
    # The executor, not the server, starts tool processes: it reads its own file, never the server's.
    if env_file_value SANDSTORM_TOOL_ENV_ALLOW >/dev/null; then
        warn "$ENV_FILE sets SANDSTORM_TOOL_ENV_ALLOW, which tools do not get from there: move it, and the variables it names, to $EXECUTOR_ENV_FILE (see deploy/executor.env.example)"
    fi
    if env_file_value SANDSTORM_EXECUTOR_SOCKET >/dev/null; then
        warn "$ENV_FILE sets SANDSTORM_EXECUTOR_SOCKET, overriding the server unit's ($EXECUTOR_RUN_DIR/executor.sock): remove it unless you moved the executor"
    fi
    url="$(env_file_value SANDSTORM_PUBLIC_URL || true)"
    if [ -n "$url" ] && [ "$url" != "$PUBLIC_URL" ]; then
        warn "$ENV_FILE has SANDSTORM_PUBLIC_URL=$url, but SANDSTORM_DOMAIN is $DOMAIN: edit the file if the name changed"
    fi
}

# A systemd value for a limit: a number (with K, M, G or T for memory), a percentage, or "infinity".
# How many workers, and the Redis they share (docs/scaling.md): after the env file, before anything of theirs.
plan_workers() {
    [ -n "$WORKERS" ] || WORKERS="$(installed_workers)"
    say "Workers: $WORKERS"
    [ "$WORKERS" -gt 1 ] || return 0
    env_file_value DATABASE_URL >/dev/null ||
        die "$WORKERS workers need PostgreSQL: set DATABASE_URL in $ENV_FILE (docs/operations.md, PostgreSQL), then rerun"
    if env_file_value SANDSTORM_REDIS_URL >/dev/null; then
        note "Redis: SANDSTORM_REDIS_URL from $ENV_FILE"
        return 0
    fi
    OWN_REDIS=1
    UNIT_REDIS_URL="unix://$REDIS_RUN_DIR/redis.sock"
    note "Redis: $REDIS_UNIT.service, on $REDIS_RUN_DIR/redis.sock (the server's user alone), nothing kept on disk"
    if [ "$(dpkg-query -W -f='${db:Status-Status}' redis-server 2>/dev/null || true)" != installed ]; then
        run apt-get update -qq
        run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server
        # The package starts a Redis of its own on 127.0.0.1:6379, which every local user (an agent too) may use.
        run systemctl disable --now redis-server.service
    fi
}

# The number of workers the installed units run (1 before any).
installed_workers() {
    local line
    line="$(as_root grep -E '^Environment=SANDSTORM_WORKERS=' "$UNIT_DIR/$SERVICE.service" 2>/dev/null | tail -n 1 || true)"
    line="${line#Environment=SANDSTORM_WORKERS=}"
    if [[ "$line" =~ ^[1-9][0-9]*$ ]]; then printf '%s\n' "$line"; else echo 1; fi
}

# The numbers of the enabled worker instances (2..N).
worker_instances() {
    as_root find "$UNIT_DIR" -path '*.wants/*' -name "$WORKER_UNIT@*" -printf '%f\n' 2>/dev/null |
        sed -nE "s/^$WORKER_UNIT@([0-9]+)\..*/\1/p" | sort -un
}

# Worker 1 is $SERVICE.service on $SERVICE.socket; worker N an instance of the template.
worker_service() { if [ "$1" -eq 1 ]; then echo "$SERVICE.service"; else echo "$WORKER_UNIT@$1.service"; fi; }
worker_socket_unit() { if [ "$1" -eq 1 ]; then echo "$SERVICE.socket"; else echo "$WORKER_UNIT@$1.socket"; fi; }

# Fewer workers than before, or no Redis of our own any more: stop and remove what is no longer wanted.
retire_extra_units() {
    local number
    for number in $(worker_instances); do
        [ "$number" -gt "$WORKERS" ] || continue
        run systemctl disable --now "$(worker_service "$number")" "$(worker_socket_unit "$number")"
        CHANGED_UNITS=1
    done
    if [ "$WORKERS" -eq 1 ]; then
        if remove_file "$UNIT_DIR/$WORKER_UNIT@.service"; then CHANGED_UNITS=1; fi
        if remove_file "$UNIT_DIR/$WORKER_UNIT@.socket"; then CHANGED_UNITS=1; fi
        if remove_file "$UNIT_DIR/$WORKER_UNIT@.service.d/worker.conf"; then CHANGED_UNITS=1; fi
    fi
    if [ "$OWN_REDIS" -eq 0 ] && as_root test -e "$UNIT_DIR/$REDIS_UNIT.service"; then
        run systemctl disable --now "$REDIS_UNIT.service"
        remove_file "$UNIT_DIR/$REDIS_UNIT.service" || true
        CHANGED_UNITS=1
    fi
    return 0
}

valid_limit() {
    local kind="$1" value="$2"
    [ "$value" = infinity ] && return 0
    [[ "$value" =~ ^[1-9][0-9]?%$|^100%$ ]] && return 0
    if [ "$kind" = tasks ]; then
        [[ "$value" =~ ^[1-9][0-9]*$ ]]
    else
        [[ "$value" =~ ^[1-9][0-9]*[KMGT]?$ ]]
    fi
}

# The executor's limits from the env file (or the defaults), checked before anything changes.
read_executor_limits() {
    TASKS_MAX="$(env_file_value SANDSTORM_EXECUTOR_TASKS_MAX || echo "$DEFAULT_TASKS_MAX")"
    MEMORY_HIGH="$(env_file_value SANDSTORM_EXECUTOR_MEMORY_HIGH || echo "$DEFAULT_MEMORY_HIGH")"
    MEMORY_MAX="$(env_file_value SANDSTORM_EXECUTOR_MEMORY_MAX || echo "$DEFAULT_MEMORY_MAX")"
    valid_limit tasks "$TASKS_MAX" ||
        die "SANDSTORM_EXECUTOR_TASKS_MAX in $ENV_FILE must be a number of tasks, a percentage or infinity, not '$TASKS_MAX'; nothing was changed"
    valid_limit memory "$MEMORY_HIGH" ||
        die "SANDSTORM_EXECUTOR_MEMORY_HIGH in $ENV_FILE must be bytes (with K, M, G or T), a percentage or infinity, not '$MEMORY_HIGH'; nothing was changed"
    valid_limit memory "$MEMORY_MAX" ||
        die "SANDSTORM_EXECUTOR_MEMORY_MAX in $ENV_FILE must be bytes (with K, M, G or T), a percentage or infinity, not '$MEMORY_MAX'; nothing was changed"
    note "tool executor limits: TasksMax=$TASKS_MAX MemoryHigh=$MEMORY_HIGH MemoryMax=$MEMORY_MAX"
}

install_manage() {
    say "sandstorm-manage"
    put_rendered "$REPO/deploy/sandstorm-manage" "$MANAGE" 0755 root:root || true
}

# Migrations, and on the first install the admin user and a bearer token (each printed once, by bootstrap).
bootstrap() {
    say "Database"
    if [ "$DRY_RUN" -eq 1 ]; then
        note "would run: sandstorm-manage bootstrap (migrations; first install: admin user and token, printed once)"
        return 0
    fi
    # What bootstrap prints (on a first install the admin password and a token, shown once) is kept, root's
    # alone, until the smoke test has passed: nothing is announced as ready before it is.
    BOOTSTRAP_OUTPUT="$(mktemp)"
    trap keep_unshown_secrets EXIT
    local status=0
    if [ ${#SUDO[@]} -eq 0 ]; then
        "$MANAGE" bootstrap >"$BOOTSTRAP_OUTPUT" || status=$?
    else
        # shellcheck disable=SC2024  # on purpose: the file is the invoking admin's (mktemp, 0600)
        sudo --preserve-env=SANDSTORM_ADMIN_PASSWORD -- "$MANAGE" bootstrap >"$BOOTSTRAP_OUTPUT" || status=$?
    fi
    if [ "$status" -ne 0 ]; then
        cat "$BOOTSTRAP_OUTPUT"
        die "sandstorm-manage bootstrap failed (exit $status): see the lines above"
    fi
    note "migrations applied"
}

# Exit trap: an install that fails after bootstrap leaves what it printed (maybe the only copy of the first admin
# password and token) in its file, and says where, instead of printing it under an error.
keep_unshown_secrets() {
    [ -n "${BOOTSTRAP_OUTPUT:-}" ] || return 0
    if [ "$FIRST_INSTALL" -eq 1 ] && [ -s "$BOOTSTRAP_OUTPUT" ]; then
        printf 'install.sh: Sandstorm is NOT ready. The first admin password and token (shown once) are in %s (yours alone): read it, then delete it.\n' "$BOOTSTRAP_OUTPUT" >&2
    else
        rm -f "$BOOTSTRAP_OUTPUT"
    fi
}

# After the smoke test: what bootstrap printed, now true.
show_bootstrap_output() {
    [ -n "${BOOTSTRAP_OUTPUT:-}" ] || return 0
    cat "$BOOTSTRAP_OUTPUT"
    rm -f "$BOOTSTRAP_OUTPUT"
    BOOTSTRAP_OUTPUT=""
}

install_units() {
    say "systemd units"
    local template
    retire_extra_units
    if put_rendered "$REPO/deploy/$EXECUTOR.socket" "$UNIT_DIR/$EXECUTOR.socket" 0644 root:root; then
        CHANGED_UNITS=1
        CHANGED_SOCKET=1
    fi
    put_rendered "$REPO/deploy/$EXECUTOR.service" "$UNIT_DIR/$EXECUTOR.service" 0644 root:root && CHANGED_UNITS=1
    put_rendered "$REPO/deploy/systemd/tmpfiles.conf" "$TMPFILES_CONF" 0644 root:root && CHANGED_SERVER_SOCKET=1
    if put_rendered "$REPO/deploy/$SERVICE.socket" "$UNIT_DIR/$SERVICE.socket" 0644 root:root; then
        CHANGED_UNITS=1
        CHANGED_SERVER_SOCKET=1
    fi
    put_rendered "$REPO/deploy/sandstorm-mcp.service" "$UNIT_DIR/$SERVICE.service" 0644 root:root && CHANGED_UNITS=1
    if [ "$WORKERS" -gt 1 ]; then
        # The same units as a template for workers 2..N (`%i`: the instance's number), part of $SERVICE.service.
        WORKER=%i SOCKET_UNIT="$WORKER_UNIT@%i.socket"
        if put_rendered "$REPO/deploy/$SERVICE.socket" "$UNIT_DIR/$WORKER_UNIT@.socket" 0644 root:root; then
            CHANGED_UNITS=1
            CHANGED_SERVER_SOCKET=1
        fi
        put_rendered "$REPO/deploy/sandstorm-mcp.service" "$UNIT_DIR/$WORKER_UNIT@.service" 0644 root:root && CHANGED_UNITS=1
        put_rendered "$REPO/deploy/systemd/worker.conf" "$UNIT_DIR/$WORKER_UNIT@.service.d/worker.conf" 0644 root:root &&
            CHANGED_UNITS=1
        WORKER=1 SOCKET_UNIT="$SERVICE.socket"
    fi
    if [ "$OWN_REDIS" -eq 1 ] && put_rendered "$REPO/deploy/$REDIS_UNIT.service" "$UNIT_DIR/$REDIS_UNIT.service" 0644 root:root; then
        CHANGED_UNITS=1
        CHANGED_REDIS=1
    fi
    put_rendered "$REPO/deploy/systemd/executor-limits.conf" "$LIMITS_DROP_IN" 0644 root:root && CHANGED_UNITS=1
    for template in "$REPO"/deploy/systemd/*.service "$REPO"/deploy/systemd/*.timer; do
        put_rendered "$template" "$UNIT_DIR/$(basename "$template")" 0644 root:root && CHANGED_UNITS=1
    done
    configure_agent_sudo
    if [ "$CHANGED_UNITS" -eq 1 ]; then
        run systemctl daemon-reload
    fi
}

# The drop-in goes on the executor's unit, where tools run; the server's unit is never relaxed.
configure_agent_sudo() {
    if [ "$AGENT_SUDO" -eq 0 ]; then
        if remove_file "$DROP_IN"; then CHANGED_UNITS=1; fi
        if remove_file "$SUDOERS_FILE"; then
            warn "removed the agents' sudo rule ($SUDOERS_FILE): pass --agent-sudo to keep it"
        fi
        return 0
    fi
    put_rendered "$REPO/deploy/systemd/agent-sudo.conf" "$DROP_IN" 0644 root:root && CHANGED_UNITS=1
    local rule
    rule="$(mktemp)"
    render "$REPO/deploy/sudoers.agent-sudo" >"$rule"
    if command -v visudo >/dev/null 2>&1 && ! visudo -cqf "$rule"; then
        rm -f "$rule"
        die "the sudoers rule does not validate (visudo -c); nothing was changed in /etc/sudoers.d"
    fi
    put_file "$rule" "$SUDOERS_FILE" 0440 root:root || true
    rm -f "$rule"
    warn "--agent-sudo: tools may run 'sudo apt-get install' as root. A package's install scripts run as root,"
    warn "so whoever holds a full-scope token can take over this host. Re-run without --agent-sudo to revoke it."
}

unit_enabled() { systemctl is-enabled --quiet "$1" 2>/dev/null; }
unit_active() { systemctl is-active --quiet "$1" 2>/dev/null; }

enable_units() {
    local timer
    unit_enabled "$EXECUTOR.socket" || run systemctl enable "$EXECUTOR.socket"
    unit_enabled "$EXECUTOR.service" || run systemctl enable "$EXECUTOR.service"
    local number
    for number in $(seq 1 "$WORKERS"); do
        unit_enabled "$(worker_socket_unit "$number")" || run systemctl enable "$(worker_socket_unit "$number")"
        unit_enabled "$(worker_service "$number")" || run systemctl enable "$(worker_service "$number")"
    done
    if [ "$OWN_REDIS" -eq 1 ]; then
        unit_enabled "$REDIS_UNIT.service" || run systemctl enable "$REDIS_UNIT.service"
    fi
    for timer in backup cleartokens prune-clients prune-output; do
        unit_enabled "$SERVICE-$timer.timer" || run systemctl enable --now "$SERVICE-$timer.timer"
    done
    # Audit records are kept forever unless the admin chose a retention.
    if env_file_value SANDSTORM_AUDIT_RETENTION_DAYS >/dev/null; then
        unit_enabled "$SERVICE-audit-prune.timer" || run systemctl enable --now "$SERVICE-audit-prune.timer"
    elif unit_enabled "$SERVICE-audit-prune.timer"; then
        run systemctl disable --now "$SERVICE-audit-prune.timer"
    fi
}

# Stop both services before new code and dependencies go in under them, so nothing runs half-upgraded: the server
# first (it has the executor end the calls in flight and records them as cancelled), then the executor.
# Background processes agents started keep running (the executor's unit has KillMode=process).
stop_for_upgrade() {
    [ "$CHANGED_CODE" -eq 1 ] || return 0
    if unit_active "$SERVICE.service"; then
        say "Stopping the server for the upgrade (running tool calls are finished or recorded as cancelled)"
        run systemctl stop "$SERVICE.service"
    fi
    # The other workers stop with it (PartOf=). The sockets too, or the next request through Caddy would start a
    # worker again on half-installed code.
    local number
    for number in $(seq 1 "$WORKERS") $(worker_instances); do
        if unit_active "$(worker_socket_unit "$number")"; then
            run systemctl stop "$(worker_socket_unit "$number")"
        fi
    done
    if unit_active "$EXECUTOR.service"; then
        say "Stopping the tool executor for the upgrade (background processes keep running)"
        run systemctl stop "$EXECUTOR.service"
    fi
}

# The executor's socket, then the executor, then the server (whose smoke test needs the executor). Each is
# (re)started only if something it runs changed.
start_service() {
    say "Services"
    enable_units
    # systemd will not restart a socket whose service holds it: a changed socket unit takes the executor down first.
    if [ "$CHANGED_SOCKET" -eq 1 ] && unit_active "$EXECUTOR.socket"; then
        if unit_active "$EXECUTOR.service"; then
            run systemctl stop "$EXECUTOR.service"
        fi
        run systemctl restart "$EXECUTOR.socket"
    elif ! unit_active "$EXECUTOR.socket"; then
        run systemctl start "$EXECUTOR.socket"
    fi
    start_or_restart "$EXECUTOR.service" $((CHANGED_CODE + CHANGED_UNITS))
    if [ "$OWN_REDIS" -eq 1 ]; then
        start_or_restart "$REDIS_UNIT.service" "$CHANGED_REDIS"
    fi
    # Each worker's socket likewise: the worker stops first, so the socket restarts without a service holding it.
    local number socket_unit
    for number in $(seq 1 "$WORKERS"); do
        socket_unit="$(worker_socket_unit "$number")"
        if [ "$CHANGED_SERVER_SOCKET" -eq 1 ] || ! unit_active "$socket_unit"; then
            if unit_active "$(worker_service "$number")"; then
                run systemctl stop "$(worker_service "$number")"
            fi
            run systemd-tmpfiles --create "$TMPFILES_CONF"
            run systemctl restart "$socket_unit"
        fi
        start_or_restart "$(worker_service "$number")" $((CHANGED_CODE + CHANGED_UNITS + CHANGED_CONFIG))
    done
}

start_or_restart() {
    local unit="$1" changes="$2"
    if ! unit_active "$unit"; then
        run systemctl start "$unit"
    elif [ "$changes" -gt 0 ]; then
        run systemctl restart "$unit"
    else
        note "$unit running, nothing to restart"
    fi
}

# Our site goes in a file of its own; the main Caddyfile only imports it, so other sites can live beside it.
install_caddy_site() {
    say "Caddy"
    MAX_REQUEST_BYTES="$(env_file_value SANDSTORM_MAX_REQUEST_BYTES || echo "$MAX_REQUEST_BYTES")"
    put_rendered "$REPO/deploy/Caddyfile" "$CADDY_SITE" 0644 root:root && CHANGED_CADDY=1
    ensure_caddy_import && CHANGED_CADDY=1
    ensure_caddy_admin && CHANGED_CADDY_ADMIN=1
    if put_rendered "$REPO/deploy/systemd/caddy-admin.conf" "$CADDY_DROP_IN" 0644 root:root; then
        CHANGED_CADDY_ADMIN=1
        run systemctl daemon-reload
    fi
    if [ "$((CHANGED_CADDY + CHANGED_CADDY_ADMIN))" -gt 0 ] && [ "$DRY_RUN" -eq 0 ]; then
        as_root caddy validate --adapter caddyfile --config "$CADDY_DIR/Caddyfile" >/dev/null 2>&1 ||
            die "Caddy rejects $CADDY_DIR/Caddyfile (see: caddy validate --adapter caddyfile --config $CADDY_DIR/Caddyfile); Caddy keeps running its previous configuration"
    fi
    if ! unit_active caddy.service; then
        run systemctl enable --now caddy.service || caddy_failed start
    elif [ "$CHANGED_CADDY_ADMIN" -eq 1 ]; then
        # `caddy reload` would look for the admin API where the new file puts it, not where the running Caddy
        # listens: a restart (once, when the address moves) makes the socket's directory and moves it.
        say "Restarting Caddy: its admin API moves to $CADDY_ADMIN_SOCKET"
        run systemctl restart caddy.service || caddy_failed restart
    elif [ "$CHANGED_CADDY" -eq 1 ]; then
        run systemctl reload caddy.service || caddy_failed reload
    else
        note "site unchanged"
    fi
}

# caddy.service would not start (or reload): what its journal says, and how to go on.
caddy_failed() {
    printf 'install.sh: error: caddy.service failed to %s. Its journal (journalctl -u caddy):\n' "$1" >&2
    as_root journalctl -u caddy.service -n 15 --no-pager -o cat >&2 2>/dev/null || true
    die "Caddy is not serving $DOMAIN: fix what the journal above says (often another program on port 80 or 443: ss -ltnp), then rerun: SANDSTORM_DOMAIN=$DOMAIN bash deploy/install.sh"
}

# Refused before anything changes: a main Caddyfile whose admin option this installer must not overwrite.
check_caddy_admin() {
    local main="$CADDY_DIR/Caddyfile" why
    as_root test -f "$main" || return 0
    why="$(as_root python3 "$REPO/deploy/caddy_admin.py" check "$main" "$CADDY_ADMIN_SOCKET" 2>&1)" ||
        die "Caddy's admin API must be out of agents' reach, and $why; nothing was changed"
}

# The admin option in the main Caddyfile's global options (deploy/caddy_admin.py). Returns 0 if it changed it.
ensure_caddy_admin() {
    local main="$CADDY_DIR/Caddyfile" draft status=0
    if ! as_root test -f "$main"; then  # a dry run's: ensure_caddy_import writes it otherwise
        note "would put Caddy's admin API on $CADDY_ADMIN_SOCKET in $main"
        return 0
    fi
    draft="$(mktemp)"
    as_root python3 "$REPO/deploy/caddy_admin.py" apply "$main" "$CADDY_ADMIN_SOCKET" >"$draft" || status=$?
    if [ "$status" -eq 1 ]; then
        rm -f "$draft"
        return 1
    fi
    [ "$status" -eq 0 ] || die "could not put Caddy's admin API on $CADDY_ADMIN_SOCKET in $main (see above)"
    if [ "$DRY_RUN" -eq 0 ] && ! as_root test -e "$main.before-sandstorm"; then
        as_root cp -p "$main" "$main.before-sandstorm"
        note "kept the previous $main as $main.before-sandstorm"
    fi
    put_file "$draft" "$main" 0644 root:root || true
    rm -f "$draft"
    note "Caddy's admin API: $CADDY_ADMIN_SOCKET (root and Caddy's user only)"
    return 0
}

# Returns 0 if it changed the main Caddyfile.
ensure_caddy_import() {
    local main="$CADDY_DIR/Caddyfile" line="import $SERVICE.caddy" draft
    if as_root test -f "$main" && as_root grep -qxF "$line" "$main"; then
        return 1
    fi
    draft="$(mktemp)"
    # The distribution's example site (a file server on :80) is replaced; any other Caddyfile is kept and extended.
    if as_root test -f "$main" && ! as_root grep -q "The Caddyfile is an easy way to practice with Caddy" "$main"; then
        as_root cat "$main" >"$draft"
        printf '\n# Added by Sandstorm'"'"'s deploy/install.sh: the site for %s.\n%s\n' "$DOMAIN" "$line" >>"$draft"
    else
        printf '# Written by Sandstorm'"'"'s deploy/install.sh. Global options go first; other sites may follow.\n%s\n' "$line" >"$draft"
    fi
    if as_root test -f "$main" && [ "$DRY_RUN" -eq 0 ]; then
        as_root cp -p "$main" "$main.before-sandstorm"
        note "kept the previous $main as $main.before-sandstorm"
    fi
    put_file "$draft" "$main" 0644 root:root || true
    rm -f "$draft"
    return 0
}

# --- smoke test: the way users come, through Caddy -------------------------------------------------------------
# Straight to Daphne's socket, as root: tells "the server is down" apart from "Caddy cannot reach it".
http() { as_root curl --silent --show-error --max-time 20 --unix-socket "$SOCKET" "$@"; }

# Through Caddy, over HTTPS to the public name resolved to this host's loopback, trusting the system's CAs and
# Caddy's local CA (which issues the certificates of *.localhost and other internal names).
https() { curl --silent --show-error --max-time 20 --resolve "$DOMAIN:443:127.0.0.1" --cacert "$CA_BUNDLE" "$@"; }

make_ca_bundle() {
    CA_BUNDLE="$(mktemp)"
    cat /etc/ssl/certs/ca-certificates.crt >"$CA_BUNDLE" 2>/dev/null || true
    as_root cat "$CADDY_LOCAL_ROOT" >>"$CA_BUNDLE" 2>/dev/null || true
}

# Every worker: /health on its socket answers 200, from that worker (a worker answering on another's socket would
# be a wiring mistake), and Caddy's user may connect to it.
check_every_worker() {
    local number
    for number in $(seq 1 "$WORKERS"); do
        SOCKET="$(worker_socket "$number")"
        wait_until_ready
        check_worker_number "$number"
        check_caddy_reaches_socket
    done
    SOCKET="$(worker_socket 1)"
}

check_worker_number() {
    local answered
    answered="$(http "http://$DOMAIN/health" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("worker"))')"
    [ "$answered" = "$1" ] || die "$SOCKET is answered by worker $answered, not $1: see systemctl cat $(worker_service "$1")"
}

# Until /health answers 200 on the socket, which it does only when the executor answers the server too (503 otherwise).
wait_until_ready() {
    local deadline=$((SECONDS + READY_DEADLINE)) status
    while true; do
        status="$(http -o /dev/null -w '%{http_code}' "http://$DOMAIN/health" 2>/dev/null || true)"
        [ "$status" = 200 ] && return 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            if [ "$status" = 503 ]; then
                die "/health answers 503: the server runs, but the tool executor does not answer on $EXECUTOR_RUN_DIR/executor.sock: see journalctl -u $EXECUTOR"
            fi
            die "the server did not answer /health on $SOCKET within ${READY_DEADLINE}s: see journalctl -u $SERVICE"
        fi
        sleep 0.5
    done
}

# Caddy proxies as its own user: that user, and no one else but the server's, must be able to connect.
check_caddy_reaches_socket() {
    local status error
    error="$(mktemp)"
    status="$(as_root runuser -u "$CADDY_USER" -- curl --silent --show-error --max-time 20 --unix-socket "$SOCKET" \
        -o /dev/null -w '%{http_code}' "http://$DOMAIN/health" 2>"$error" || true)"
    if [ "$status" != 200 ]; then
        local why
        why="$(head -n 1 "$error")"
        rm -f "$error"
        die "Caddy's user '$CADDY_USER' cannot reach Daphne's socket ($status${why:+: $why}), so every request through Caddy would be a 502. Its directory, the lock: $(as_root ls -ld "$RUN_DIR" 2>&1) (wanted: drwxr-x--- $SERVICE_USER $CADDY_GROUP, from $TMPFILES_CONF); see systemctl status $SERVICE.socket"
    fi
    rm -f "$error"
    note "$SOCKET: $CADDY_USER connects (200)"
}

# Until /health answers 200 through Caddy (a first ACME certificate can take a while).
wait_until_https() {
    local deadline=$((SECONDS + HTTPS_DEADLINE)) status error
    error="$(mktemp)"
    while true; do
        status="$(https -o /dev/null -w '%{http_code}' "https://$DOMAIN/health" 2>"$error" || true)"
        [ "$status" = 200 ] && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            local why
            why="$(head -n 1 "$error")"
            rm -f "$error"
            die "https://$DOMAIN/health through Caddy answered ${status:-nothing}${why:+ ($why)} within ${HTTPS_DEADLINE}s, not 200: see journalctl -u caddy (is $DOMAIN's DNS pointing here, ports 80 and 443 open?), then rerun: SANDSTORM_DOMAIN=$DOMAIN bash deploy/install.sh"
        fi
        sleep 1
    done
    rm -f "$error"
}

# /health's report on the executor: "MODE USER" (mode "service" when it runs under its own unit).
executor_report() {
    https "https://$DOMAIN/health" | python3 -c '
import json, sys
executor = json.load(sys.stdin).get("executor") or {}
print(executor.get("mode", "?") if executor.get("ok") else "down", executor.get("user", "?"))'
}

smoke_test() {
    say "Smoke test (through Caddy: https://$DOMAIN, resolved to 127.0.0.1)"
    if [ "$DRY_RUN" -eq 1 ]; then
        note "would check /health on every worker's socket, as root and as $CADDY_USER, then through Caddy over HTTPS: /health (and that the executor runs the tools as $AGENT_USER), /mcp without and with a token, and the OAuth protected-resource metadata"
        return 0
    fi
    check_every_worker
    make_ca_bundle
    local status=0
    (smoke_through_caddy) || status=$?
    rm -f "$CA_BUNDLE"
    [ "$status" -eq 0 ] || exit "$status"
}

smoke_through_caddy() {
    wait_until_https
    local report
    report="$(executor_report)" || die "/health answered 200 but not with the executor's status: see journalctl -u $SERVICE"
    if [ "$report" != "service $AGENT_USER" ]; then
        die "/health reports the tool executor as '$report', not 'service $AGENT_USER': tools must run as $AGENT_USER in the executor's own unit (see journalctl -u $EXECUTOR, and SANDSTORM_EXECUTOR_SOCKET in $UNIT_DIR/$SERVICE.service)"
    fi
    note "https://$DOMAIN/health: 200, tools run by the executor as $AGENT_USER"
    local headers status
    headers="$(mktemp)"
    status="$(https -o /dev/null -D "$headers" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        --data '{}' "https://$DOMAIN/mcp")"
    if [ "$status" != 401 ] || ! grep -qi '^www-authenticate: Bearer .*resource_metadata=' "$headers"; then
        rm -f "$headers"
        die "/mcp without a token answered $status, not 401 with a WWW-Authenticate: Bearer resource_metadata header"
    fi
    rm -f "$headers"
    note "/mcp without a token: 401 with WWW-Authenticate"
    check_initialize
    status="$(https -o /dev/null -w '%{http_code}' "https://$DOMAIN/.well-known/oauth-protected-resource/mcp")"
    [ "$status" = 200 ] || die "/.well-known/oauth-protected-resource/mcp answered $status, not 200"
    note "/.well-known/oauth-protected-resource/mcp: 200"
}

# An MCP initialize with a read-only token made for this check and revoked right after it.
check_initialize() {
    local name token header status
    name="install-check-$(date -u +%Y%m%d%H%M%S)"
    token="$(as_root "$MANAGE" create_token "$name" --scope mcp:read --expires-days 1 2>/dev/null | tail -n 1)"
    # The token goes to curl in a file, never on a command line other local users could read.
    header="$(mktemp)"
    chmod 0600 "$header"
    printf 'Authorization: Bearer %s\n' "$token" >"$header"
    status="$(https -o /dev/null -w '%{http_code}' -X POST -H @"$header" \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
        --data '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sandstorm-install","version":"1"}}}' \
        "https://$DOMAIN/mcp" || true)"
    rm -f "$header"
    as_root "$MANAGE" revoke_token "$name" >/dev/null 2>&1 || warn "could not revoke the check token '$name': revoke it in the admin"
    [ "$status" = 200 ] || die "/mcp initialize with a token answered $status through Caddy, not 200: see journalctl -u $SERVICE -u caddy"
    note "/mcp initialize with a token: 200"
}

workers_summary() {
    [ "${WORKERS:-1}" -gt 1 ] || return 0
    printf '  (%s workers: %s.service and %s@2..%s, restarted with it)' "$WORKERS" "$SERVICE" "$WORKER_UNIT" "$WORKERS"
}

summary() {
    [ "$DRY_RUN" -eq 1 ] && {
        say "Dry run: nothing was changed"
        return 0
    }
    cat <<EOF

Sandstorm is running at $PUBLIC_URL
  MCP endpoint:     $PUBLIC_URL/mcp
  Claude.ai:        Settings > Connectors > Add custom connector, URL $PUBLIC_URL/mcp
  Claude Code:      claude mcp remove -s user sandstorm 2>/dev/null; claude mcp add -s user --transport http sandstorm $PUBLIC_URL/mcp --header 'Authorization: Bearer <token>'
  Admin:            $PUBLIC_URL/admin/  (user admin)
  Second factor:    to require it of every staff user: SANDSTORM_REQUIRE_SECOND_FACTOR=1 in $ENV_FILE, then systemctl restart $SERVICE
  New token:        sudo sandstorm-manage create_token NAME
  Data:             $STATE_DIR (database, secret_key, audit_key; a nightly copy in $BACKUP_DIR)
  Workspace:        $WORKSPACE  (the agent user $AGENT_USER's; tools run as $AGENT_USER in $EXECUTOR)
  Configuration:    $ENV_FILE  (tools' variables: $EXECUTOR_ENV_FILE, optional)
  Services:         systemctl status $SERVICE $EXECUTOR$(workers_summary)
  Logs:             journalctl -u $SERVICE -u $EXECUTOR -f   (Caddy: journalctl -u caddy)
  Upgrade:          git pull && SANDSTORM_DOMAIN=$DOMAIN bash deploy/install.sh
EOF
    if [ "$FIRST_INSTALL" -eq 1 ]; then
        echo "  The admin password and the token above are shown once."
    fi
}

main() {
    parse_args "$@"
    check_domain
    check_os
    check_privileges
    [ "$DRY_RUN" -eq 1 ] && say "Dry run: showing what would change"
    check_caddy_admin
    install_packages
    ensure_users
    ensure_dirs
    write_env_file
    plan_workers
    read_executor_limits
    plan_code
    stop_for_upgrade
    install_code
    install_venv
    install_manage
    bootstrap
    install_units
    start_service
    install_caddy_site
    smoke_test
    show_bootstrap_output
    summary
}

main "$@"
