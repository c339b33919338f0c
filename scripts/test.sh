#!/usr/bin/env bash
# Runs the whole suite with the components it needs: a throwaway PostgreSQL server
# (Debian's postgresql, installed if missing) and, from the tests, a moto S3 server.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PGROOT=$(mktemp -d /tmp/shoal-pg.XXXXXX)
cleanup() { bash scripts/postgres.sh stop "$PGROOT" || true; rm -rf "$PGROOT"; }
trap cleanup EXIT
DB_URL=$(bash scripts/postgres.sh start "$PGROOT")
export SHOAL_TEST_POSTGRES_URL="$DB_URL"
$BIN/ruff check src tests bench
$BIN/lint-imports
$BIN/python -m pytest -n 2 -q "$@"
