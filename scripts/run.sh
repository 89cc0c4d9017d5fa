#!/usr/bin/env bash
# Installs what is missing, builds weir, and runs it on the embedded default
# (file:// object store, SQLite metastore) with the given arguments.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh" "$root/build/release" -DWEIR_TESTS=OFF
exec "$root/build/release/src/cli/weir" "${@:---version}"
