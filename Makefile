# The two commands of the README. Both create .venv themselves on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test venv bench

$(BIN)/patchset: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q '.[test]'
	touch $@

venv: $(BIN)/patchset

# Main job on the built-in localhost default: provision the pinned SGLang, apply the
# safe tier to the default tree, show its status.
run: venv
	$(BIN)/pip install -q --no-deps --force-reinstall .
	$(BIN)/patchset check
	$(BIN)/patchset apply --tier safe localhost
	$(BIN)/patchset status localhost

# The whole test suite, with the system packages the test hosts need.
test: venv
	.ci/install-host-deps
	$(BIN)/pip install -q --no-deps --force-reinstall .
	$(BIN)/python -m pytest -q

# Benchmarks (not tests): patchset vs git am / quilt, fleet, transfer, CLI start.
bench: venv
	.ci/install-host-deps
	command -v quilt >/dev/null || apt-get install -y -q quilt
	$(BIN)/pip install -q --no-deps --force-reinstall .
	$(BIN)/python bench/benchmark.py -o bench/RESULTS.md
