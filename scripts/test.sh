#!/usr/bin/env bash
# Runs the whole suite with the components it needs: a throwaway PostgreSQL server
# (Debian's postgresql, installed if missing), headless Chromium for the console's browser
# tests (Debian's chromium, installed if missing) and, from the tests, a moto S3 server.
# It also builds shoal's wheel and installs it per extra into fresh venvs under one temporary
# directory (tests/installs.py), where tests/e2e/test_install.py and test_readme.py run it
# as a user would; the uv cache is the one the dev venv was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PGROOT=$(mktemp -d /tmp/shoal-pg.XXXXXX)
INSTALLS=$(mktemp -d /tmp/shoal-installs.XXXXXX)
cleanup() { bash scripts/postgres.sh stop "$PGROOT" || true; rm -rf "$PGROOT" "$INSTALLS"; }
trap cleanup EXIT
DB_URL=$(bash scripts/postgres.sh start "$PGROOT")
export SHOAL_TEST_POSTGRES_URL="$DB_URL" SHOAL_TEST_INSTALLS="$INSTALLS"
SHOAL_TEST_CHROMIUM=$(bash scripts/chromium.sh)
export SHOAL_TEST_CHROMIUM
$BIN/ruff check src tests bench
# --no-cache: a cache left by an earlier checkout can report a broken contract as kept.
$BIN/lint-imports --no-cache
# mypy --strict on src/shoal: pyproject.toml's [tool.mypy] says which files and how.
$BIN/mypy
# The wheel first, once (the xdist workers would otherwise wait on each other for it).
$BIN/uv build -q --wheel --out-dir "$INSTALLS/dist" .
$BIN/python -m pytest -n 2 -q "$@"
