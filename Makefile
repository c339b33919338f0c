# Two commands: `make demo` and `make test`. Both create or refresh .venv first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check 'uv>=0.8'
	@# Extras are the user's features ([all] is every one); dev and bench are PEP 735
	@# dependency groups (uv pip install --group needs uv 0.8+).
	@# torch through pip first: pip takes the CPU build from this machine's disk (uv would
	@# download a multi-GB CUDA build); uv then sees it installed and keeps it.
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt torch
	$(BIN)/uv pip install --python $(BIN)/python -q -c constraints.txt -e '.[all]' --group dev
	@# PYTHONDONTWRITEBYTECODE is set on these machines: compile once so imports stay fast.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/shoal demo

test: $(STAMP)
	bash scripts/test.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/uv pip install --python $(BIN)/python -q -c constraints.txt -e '.[all]' --group dev --group bench
	$(BIN)/python bench/import_time.py
	$(BIN)/python bench/dispatch.py
	$(BIN)/python bench/envs.py
	$(BIN)/python bench/warm.py

clean:
	rm -rf $(VENV)
