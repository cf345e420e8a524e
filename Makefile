# Two commands do everything on a machine with Python 3.11+, pip, git and make:
#   make demo   — install into .venv, then run a whole star-count campaign in this terminal
#   make test   — install into .venv, then lint, type-check and run the test suite (on every core)
#   make gym-venv — the Python 3.12 venv with NeMo Gym 0.4.0 (make test builds it; see below)
#   make llama-venv — llama.cpp's server and a 135M model for the real-model test (make test builds it)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CODEX_VERSION := 0.171.0
CODEX := .codex-cli/node_modules/.bin/codex

.PHONY: demo test bench install clean check-wheel typecheck gym-venv llama-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The repository root is the package, so setuptools made the editable install an import hook,
	# which imports pathlib and importlib in every interpreter: 11 ms of each process's start (the
	# agent's, each standby's, each verb's) that an installed wheel does not pay. A path entry to a
	# link named goaltender finds the same files for nothing.
	mkdir -p $(VENV)/src && ln -sfn "$(CURDIR)" $(VENV)/src/goaltender
	$(BIN)/python -c "import pathlib, sys, sysconfig; [p.write_text(sys.argv[1] + '\n') for p in \
		pathlib.Path(sysconfig.get_path('purelib')).glob('__editable__.goaltender-*.pth')]" "$(CURDIR)/$(VENV)/src"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/goaltender demo

$(CODEX):  # the real Codex CLI, for the Codex backend's end-to-end tests (the npm package ships the binary)
	npm install --silent --no-save --no-audit --no-fund --prefix .codex-cli @openai/codex@$(CODEX_VERSION)

# NeMo Gym 0.4.0 needs Python >= 3.12, so tests/test_gym.py runs it from a venv of its own, built
# from the newest 3.12 under the pyenv root into ~/.cache/goaltender (1.4 GB, 4-6 min; kept
# between runs and clean clones where the machine keeps its cache) and linked as .venv-gym.
# GOALTENDER_SKIP_GYM=1 (no Python 3.12 here) skips both the build and those tests.
gym-venv:
ifeq ($(GOALTENDER_SKIP_GYM),1)
	@echo "GOALTENDER_SKIP_GYM=1: no NeMo Gym venv; tests/test_gym.py will skip"
else
	venv=$$(bash environments/star_count/gym_venv.sh) && ln -sfn "$$venv" .venv-gym
endif

# tests/test_real_model.py runs the built-in agent against a real model: llama-cpp-python's server
# with SmolLM2-135M, in a venv of its own built once into ~/.cache/goaltender (llama.cpp compiled
# from source, ~2-5 min on 2 CPUs; it needs a C++ compiler, and without one the test skips) and
# linked as .venv-llama.
# GOALTENDER_SKIP_LLAMA=1 skips both the build and that test.
llama-venv:
ifeq ($(GOALTENDER_SKIP_LLAMA),1)
	@echo "GOALTENDER_SKIP_LLAMA=1: no llama.cpp venv; tests/test_real_model.py will skip"
else
	venv=$$(bash tests/llama_venv.sh) && if [ -n "$$venv" ]; then ln -sfn "$$venv" .venv-llama; fi
endif

test: $(STAMP) $(CODEX) gym-venv llama-venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/pytest -n auto --durations=10
	$(BIN)/pytest -m soak  # alone: 50,000 events under SSH drops and SIGKILLs (tests/test_soak.py)

# mypy names modules after folders, and the repository root is the goaltender package: check it
# through a link of that name (kept inside .venv).
typecheck: $(STAMP)
	mkdir -p $(VENV)/typecheck && ln -sfn $(CURDIR) $(VENV)/typecheck/goaltender
	cd $(VENV)/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		--cache-dir $(CURDIR)/.mypy_cache -p goaltender

# A user's install: the wheel (not editable) into a fresh venv, run from outside the checkout; then
# that venv's runner, started by its console script with PATH=/usr/bin:/bin as a service is, runs a
# goal whose agent and experiments use its `goaltender` and `python -m goaltender…` (the test suite's
# pytest drives it: the wheel's venv has no pytest).
check-wheel: $(STAMP)
	rm -rf .venv-wheel && $(PYTHON) -m venv .venv-wheel
	.venv-wheel/bin/python -m pip install --quiet .
	rm -rf build
	cd /tmp && $(CURDIR)/.venv-wheel/bin/python -c "from goaltender.agents.briefing import SKILLS_DIR; \
		import goaltender; assert '.venv-wheel' in goaltender.__file__, goaltender.__file__; \
		assert (SKILLS_DIR / 'autoresearch' / 'SKILL.md').is_file(), SKILLS_DIR"
	d=$$(mktemp -d) && cd $$d && $(CURDIR)/.venv-wheel/bin/goaltender demo --yes --dir $$d/demo \
		"train the star-count model to 90% exact accuracy, max 2 experiments" </dev/null && rm -rf $$d
	GOALTENDER_TEST_INSTALL=$(CURDIR)/.venv-wheel $(BIN)/pytest -q -p no:cacheprovider \
		tests/test_agent_path.py -k console_script

# The Ray head and the one-node Slurm cluster that tests/test_executors_remote.py runs against
# (installed when missing; stop them with tests/engines.sh stop).
.PHONY: engines
engines:
	tests/engines.sh start

bench: $(STAMP) check-wheel
	$(BIN)/python benchmarks/bench_runner.py
	$(BIN)/python benchmarks/bench_bot.py
	$(BIN)/python benchmarks/bench_redact.py
	$(BIN)/python benchmarks/bench_metrics.py
	$(BIN)/python benchmarks/bench_parsing.py
	$(BIN)/python benchmarks/bench_wire.py
	$(BIN)/python benchmarks/bench_history.py
	$(BIN)/python benchmarks/bench_cli.py
	.venv-wheel/bin/python benchmarks/bench_cli.py  # as users install it (see its docstring)
	$(BIN)/python benchmarks/bench_slots.py
	$(BIN)/python benchmarks/bench_search.py
	$(BIN)/python benchmarks/bench_campaign.py
	$(BIN)/python benchmarks/bench_prompt.py  # SmolLM2's token counts with .venv-llama (make llama-venv)

clean:
	rm -rf $(VENV) .venv-wheel .codex-cli goaltender-demo build .venv-gym .venv-llama  # the links; the venvs stay cached
