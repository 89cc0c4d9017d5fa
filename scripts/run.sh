#!/usr/bin/env bash
# Installs what is missing, builds weir, and runs it with the given arguments;
# with none, `weir serve`: the HTTP API on 127.0.0.1:8080 over the embedded
# default (file://./weir-data/objects and sqlite://./weir-data/meta.db).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh" "$root/build/release" -DWEIR_TESTS=OFF
if [ $# -eq 0 ]; then set -- serve; fi
exec "$root/build/release/src/cli/weir" "$@"
