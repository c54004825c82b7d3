# Two entry points for a fresh machine: `make run` serves, `make test` checks.
# The virtual environment lives in .venv; torch is installed first, pinned, so pip never pulls a
# different build (on this project's CPU machines the pinned release is a CPU build on local disk).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: run test lint typecheck unit install dev system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "installing $(TORCH) and the service into $(VENV) (once; a minute or two)..."
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed
	@echo "installing the test tools into $(VENV) (once)..."
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

run: $(VENV)/.installed
	$(BIN)/python -m service --host 0.0.0.0 --port 8000

lint: dev
	$(BIN)/ruff check service tests loadtests
	$(BIN)/ruff format --check service tests loadtests

typecheck: dev
	$(BIN)/mypy

# The deployment tests run the real nginx, Prometheus, Redis and a headless Chromium (Debian
# packages) on loopback, and the Node clients (deepl-node, translate) with Node.js.
system-deps:
	@missing=""; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx-light"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	command -v chromium >/dev/null || missing="$$missing chromium fonts-liberation"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "the tests need:$$missing (sudo apt-get install$$missing)" >&2; exit 1; \
	  fi; \
	fi

NODE_CLIENTS := tests/clients/node
$(NODE_CLIENTS)/node_modules/.package-lock.json: $(NODE_CLIENTS)/package-lock.json | system-deps
	@echo "installing the Node clients the dialect tests drive (once)..."
	npm ci --prefix $(NODE_CLIENTS) --no-audit --no-fund --loglevel=error

unit: dev system-deps $(NODE_CLIENTS)/node_modules/.package-lock.json
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadfile

test: lint typecheck unit
