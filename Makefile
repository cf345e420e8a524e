# Two commands do everything on a machine with Python 3.11+, pip, git and make:
#   make demo   — install into .venv, then run a whole star-count campaign in this terminal
#   make test   — install into .venv, then lint and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CODEX_VERSION := 0.171.0
CODEX := .codex-cli/node_modules/.bin/codex

.PHONY: demo test bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/goaltender demo

$(CODEX):  # the real Codex CLI, for the Codex backend's end-to-end tests (the npm package ships the binary)
	npm install --silent --no-save --no-audit --no-fund --prefix .codex-cli @openai/codex@$(CODEX_VERSION)

test: $(STAMP) $(CODEX)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_runner.py
	$(BIN)/python benchmarks/bench_bot.py

clean:
	rm -rf $(VENV) .codex-cli goaltender-demo
