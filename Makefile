# Sandstorm: `make run` to start a local server, `make test` to run the suite (SQLite), `make test-postgres` to run
# it again against the PostgreSQL server that DATABASE_URL names.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-fast test-postgres test-systemd bench lint check-python venv conformance clean lock

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null || \
		{ echo "Sandstorm needs Python 3.11 or newer as '$(PYTHON)' (found: $$($(PYTHON) --version 2>&1 || echo none))."; exit 1; }

$(STAMP): pyproject.toml requirements.lock | check-python
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[test,postgres]'
	@touch $(STAMP)

venv: check-python $(STAMP)

# The official MCP conformance suite and the Node.js it runs on, both pinned in tests/conformance/package-lock.json,
# for tests/test_conformance_live.py. Needs npm (Debian's will do: .ci/run installs it); without npm that test skips,
# saying so, except in CI.
CONFORMANCE := tests/conformance
CONFORMANCE_STAMP := $(CONFORMANCE)/node_modules/.installed

$(CONFORMANCE_STAMP): $(CONFORMANCE)/package.json $(CONFORMANCE)/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix $(CONFORMANCE) --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: tests/test_conformance_live.py will skip (apt install npm)"; fi

# The TypeScript SDK's OAuth client (and its Node.js), pinned in tests/typescript_sdk/package-lock.json, for the
# step-up test (tests/test_oauth_step_up_live.py); installed and skipped like the suite.
TYPESCRIPT_SDK := tests/typescript_sdk
TYPESCRIPT_SDK_STAMP := $(TYPESCRIPT_SDK)/node_modules/.installed

$(TYPESCRIPT_SDK_STAMP): $(TYPESCRIPT_SDK)/package.json $(TYPESCRIPT_SDK)/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix $(TYPESCRIPT_SDK) --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the TypeScript SDK's step-up test will skip (apt install npm)"; fi

conformance: $(CONFORMANCE_STAMP) $(TYPESCRIPT_SDK_STAMP)

# One command (mcpserver/management/commands/run.py): the port first, then bootstrap, then Daphne; the banner once
# /health answers.
run: venv
	$(PY) manage.py run

# pytest-xdist: a worker per core, each test module whole on one worker (its module-scoped servers made once).
PARALLEL ?= -n auto --dist loadfile

# Lint, then every tier but the slow tests (tests/tiers.py), in parallel.
test: lint conformance
	$(PY) manage.py makemigrations --check --dry-run
	env -u DATABASE_URL $(PY) -m pytest $(PARALLEL) -m "not slow"

# The slow tests alone (full installs, the bench's smoke run, damaged databases, several server processes); CI runs
# them after `make test`.
test-slow: venv
	env -u DATABASE_URL $(PY) -m pytest $(PARALLEL) -m slow

# The unit and in-process tiers only (no Daphne, no browser, no installer; tests/tiers.py), without the lint.
test-fast: venv
	env -u DATABASE_URL $(PY) -m pytest $(PARALLEL) -m "unit or inprocess"

# DATABASE_URL=postgres://user:password@host:port/name, a role that may create databases: pytest-django makes a
# test database beside NAME for each worker, and every live server one of its own (sandstorm_live_*); all are dropped
# afterwards. The tests whose outcome cannot depend on the database (tests/tiers.py, same_on_any_database) are left
# out: `make test` and `make test-slow` ran them. The slow ones that can depend on it run here.
test-postgres: venv
	@case "$$DATABASE_URL" in postgres://*|postgresql://*) ;; \
		*) echo "make test-postgres needs DATABASE_URL=postgres://user:password@host:port/name"; exit 2;; esac
	$(PY) -m pytest $(PARALLEL) -m "not same_on_any_database"

# The production install under a real systemd (not part of `make test`, which cannot boot a container): as root,
# with debootstrap and systemd-container; a Debian 12 rootfs is cached in /var/tmp/sandstorm-systemd-ci. Installs
# the committed HEAD (an upgrade from HEAD~1). Takes Caddy's ports 80, 443 and 2019 while it runs. CI runs it.
test-systemd:
	bash tests/systemd/run.sh

# The real server under load (not part of `make test`): prints a Markdown table and writes var/bench/latest.json.
# `make bench BENCH_ARGS=--quick` is a smoke run; BENCH_ARGS="--compare REF" measures REF beside this tree, in turns
# (docs/performance.md). The seeded databases are cached in var/bench/.
bench: venv
	$(PY) -m bench $(BENCH_ARGS)

# Refresh the pinned versions after changing dependencies in pyproject.toml.
lock: check-python
	rm -rf /tmp/sandstorm-lock && $(PYTHON) -m venv /tmp/sandstorm-lock
	/tmp/sandstorm-lock/bin/pip install --quiet --disable-pip-version-check -e '.[test,postgres]'
	/tmp/sandstorm-lock/bin/pip freeze --exclude-editable | grep -v '^sandstorm-mcp' > requirements.lock

clean:
	rm -rf $(VENV) build *.egg-info $(CONFORMANCE)/node_modules $(TYPESCRIPT_SDK)/node_modules

# Lint, formatting and types (configured in pyproject.toml); `make test`, and so CI, runs it first.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
