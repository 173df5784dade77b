# The two commands of the README: `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv when missing and installs the project with its pinned dependencies.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.cutline-installed

.PHONY: install class-archive test test-all test-fast lint format demo screenshots bench flink-venv clean

$(STAMP): pyproject.toml requirements.lock examples/basics/pyproject.toml examples/sessions/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	# packages of jobs, registered through the cutline.jobs entry point as a user's would be
	$(BIN)/python -m pip install --quiet --no-deps -e examples/basics -e examples/sessions
	@touch $(STAMP)

install: $(STAMP)

check-java:
	@$(BIN)/python -m spark_jobs.deploy.java_check

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The driver JVM's class-data archive, made once per Java and Spark (spark_jobs/deploy/class_archive.py)
class-archive: $(STAMP) check-java
	@$(BIN)/python -m spark_jobs.commands.class_archive

# `make test` (CI's tier): every test not marked slow, one end-to-end run per guarantee, and a
# slice of every fault matrix drawn from the seed (tests/tiers.py); `make test-all`: everything.
# CUTLINE_TEST_SEED=N reruns a printed slice. Two pytest-xdist workers, the longest tests first:
# a test's drivers leave part of the two cores idle while they start (docs/testing.md).
TEST_WORKERS ?= 2
test: $(STAMP) lint check-java class-archive
	CUTLINE_TEST_TIER=landing $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-all: $(STAMP) lint check-java class-archive
	CUTLINE_TEST_TIER=all $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-fast: $(STAMP)
	CUTLINE_TEST_TIER=landing $(BIN)/python -m pytest -q -m "not slow"

demo: $(STAMP) check-java class-archive
	$(BIN)/python -m orchestration.demo

# Screenshots of the UI of a running `make demo` (needs Chromium: apt-get install chromium).
screenshots: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[docs]'
	$(BIN)/python docs/screenshots.py --url http://127.0.0.1:3000 --out docs

# Flink, the peer benchmark's fifth system: PyFlink in a virtualenv of its own (it pins its own
# Beam, pandas and pyarrow), its jars inside the wheel
FLINK_STAMP := .venv-flink/.installed
$(FLINK_STAMP):
	@test -x .venv-flink/bin/python || $(PYTHON) -m venv .venv-flink
	.venv-flink/bin/python -m pip install --quiet apache-flink==2.3.0
	@touch $(FLINK_STAMP)

flink-venv: $(FLINK_STAMP)

bench: $(STAMP) $(FLINK_STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[bench]'
	$(BIN)/python bench/snapshot_bench.py --state-mib 100 --churn 0.01 --checkpoints 20
	$(BIN)/python bench/snapshot_bench.py --state-mib 1024 --churn 0.01 --checkpoints 10
	$(BIN)/python bench/rescale_bench.py --state-mib 1024 --rescales 2:4 4:2
	$(BIN)/python bench/savepoint_bench.py --state-mib 1024
	$(BIN)/python bench/gc_bench.py --checkpoints 1000 --shared-files 100000
	$(BIN)/python bench/peer_bench.py --sizes 100 1024

clean:
	rm -rf $(VENV) .venv-flink .pytest_cache .ruff_cache
