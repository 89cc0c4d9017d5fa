#!/usr/bin/env bash
# Runs the Arrow Flight suite: tests/flight/js/run.sh WEIR_BINARY
# Installs the pinned packages from package-lock.json (npm ci) when missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-${WEIR_BIN:-}}
[ -n "$bin" ] || { echo "usage: run.sh WEIR_BINARY" >&2; exit 2; }
command -v node >/dev/null || { echo "node not found: Node.js 20+ is needed for tests/flight/js" >&2; exit 1; }
command -v npm >/dev/null || { echo "npm not found: needed for tests/flight/js" >&2; exit 1; }
cd "$here"
if [ ! -f node_modules/apache-arrow/package.json ] || \
   ! cmp -s package-lock.json node_modules/.package-lock.json.weir 2>/dev/null; then
  npm ci --no-audit --no-fund --prefer-offline >&2
  cp package-lock.json node_modules/.package-lock.json.weir
fi
WEIR_BIN=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin") exec node --test --test-reporter=spec flight.test.mjs
