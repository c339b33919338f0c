#!/usr/bin/env bash
# Print the path of a headless-capable Chromium for the web console's browser tests
# (tests/browser/, driven by Playwright's Python package with executable_path), installing
# Debian's chromium when none is there. Playwright's own browser download is never used.
set -euo pipefail
find_bin() {
  for b in "${SHOAL_TEST_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    [ -n "$b" ] && [ -x "$b" ] && { echo "$b"; return; }
  done
  return 1
}
BIN=$(find_bin || true)
if [ -z "$BIN" ]; then
  echo "installing Debian's chromium for the browser tests..." >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) >&2
  BIN=$(find_bin)
fi
echo "$BIN"
