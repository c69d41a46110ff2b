# Holdpoint. `make run` and `make test` work on a fresh machine with only Python 3.11+.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: ts-client run test test-fast lint fmt migrate sweep worker web clean browser-deps topology-deps topology messages bench chaos chaos-short screenshots

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet -e "./clients/python[langgraph,mcp,openai-agents]"
	@touch $(STAMP)

install: $(STAMP)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	@touch $(BENCH_STAMP)

## Set everything up and start the dashboard with workers and demo agents in one process.
## SLACK=stub: decide from a local Slack stand-in too (docs/notifications.md, Slack).
run: $(STAMP) ts-client
	$(PY) manage.py serve --host $(HOST) --port $(PORT) $(if $(filter stub,$(SLACK)),--slack-stub,)

## The TypeScript client (its demo agent runs in `make run`); skipped without npm.
ts-client:
	@if command -v npm >/dev/null 2>&1; then \
	  cd clients/typescript && { test -d node_modules || npm ci --no-audit --no-fund --silent; } && npm run --silent build; \
	else echo "npm not found: the TypeScript demo worker will not start"; fi

## The whole test suite (SQLite unless DATABASE_URL is set; CI sets it).
test: $(STAMP) browser-deps topology-deps
	$(PY) -m pytest $(PYTEST_ARGS)

## The inner loop: no browser, no chaos run, no schema fuzzing or state machine.
test-fast: $(STAMP)
	$(PY) -m pytest --ignore=tests/browser --ignore=tests/chaos -m "not slow" $(PYTEST_ARGS)

browser-deps:
	@bash scripts/ensure-chromium

topology-deps:
	@bash scripts/ensure-topology

## Several web, live and worker nodes behind nginx, over PgBouncer (docs/operations.md, "More
## than one machine"). Needs DATABASE_URL and REDIS_URL; TOPOLOGY_ARGS="--web 3 --port 9000".
topology: $(STAMP) topology-deps
	@test -n "$$DATABASE_URL" -a -n "$$REDIS_URL" || { echo "make topology needs DATABASE_URL and REDIS_URL"; exit 2; }
	$(PY) -m bench.topology up $(TOPOLOGY_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy runs ledger runtime config api dashboard live
	$(VENV)/bin/mypy clients/python/holdpoint_client
	$(VENV)/bin/lint-imports

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

sweep: $(STAMP)
	$(PY) manage.py sweep

## Refresh locale/ from the code (needs GNU gettext) and compile it; commit the .po and .mo files.
MESSAGES_IGNORE := --ignore=.venv --ignore=var --ignore=test-output --ignore=tests --ignore=bench
messages: $(STAMP)
	$(PY) manage.py makemessages -l zh_Hans $(MESSAGES_IGNORE) --no-obsolete --add-location=file
	$(PY) manage.py makemessages -d djangojs -l zh_Hans $(MESSAGES_IGNORE) --no-obsolete --add-location=file
	$(PY) manage.py compilemessages -l zh_Hans $(MESSAGES_IGNORE)

## Screenshots of every page (desktop and phone, English and Chinese) into var/screenshots/,
## from a throwaway database with the demo runs (scripts/screenshots.py).
screenshots: $(STAMP) browser-deps
	$(PY) scripts/screenshots.py $(SCREENSHOTS_ARGS)

## Benchmarks against their baselines and peers, measured side by side in one run; writes
## the raw figures to bench/results/<UTC date>.md. Needs DATABASE_URL (PostgreSQL) and REDIS_URL.
## BENCH_ARGS="--quick" for smaller counts, "--sizes 10k,100k" to skip the 1M-run table.
bench: $(BENCH_STAMP)
	@test -n "$$DATABASE_URL" || { echo "make bench needs DATABASE_URL=postgres://USER@HOST:PORT/NAME"; exit 2; }
	$(PY) -m bench.all $(BENCH_ARGS)

## The chaos run: web server and workers under kills, freezes, duplicate requests and a
## PostgreSQL restart (a private cluster), then invariants. Exits non-zero on a violation;
## writes the report to bench/results/<UTC date>-chaos.md.
chaos: $(BENCH_STAMP)
	$(PY) -m chaos.harness $(CHAOS_ARGS)

## The short chaos run (about 2 minutes), as CI runs it in tests/chaos.
chaos-short: $(STAMP)
	$(PY) -m chaos.harness --short $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
