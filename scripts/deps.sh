#!/usr/bin/env bash
# Installs the Debian 12 packages weir needs to build and run, if missing;
# with --tests, also what its test suites need (and checks for Node.js 20+).
# Without --tests, configure with -DWEIR_TESTS=OFF (as scripts/run.sh does).
# Runs `apt-get update` once, only when something has to be installed.
set -euo pipefail
pkgs=(g++ cmake ninja-build ccache pkg-config
      libisal-dev libsqlite3-dev libpq-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
      libcurl4-openssl-dev libssl-dev libexpat1-dev  # s3:// (src/objstore), and the HTTP client of the CLI (src/client)
      libboost-dev          # Boost.Asio/Beast for the HTTP server (headers only)
      libnghttp2-dev        # HTTP/2 for S2S sessions (src/http)
      libsimdjson-dev       # the append body parser
      zlib1g-dev libsnappy-dev liblz4-dev libzstd-dev  # Kafka batch compression (src/wal/compression.cc)
      libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # Arrow Flight's gRPC service (src/flight)
      libflatbuffers-dev    # Arrow IPC messages are flatbuffers (src/flight)
      )
tests=false
if [ "${1:-}" = "--tests" ]; then
  tests=true
  pkgs+=(python3 python3-requests libgtest-dev libgmock-dev
         curl radosgw ceph-mon ceph-osd  # a real S3 server for the s3:// tests (tests/s3)
         postgresql                      # a real PostgreSQL server for the postgres:// tests (tests/pg)
         python3-h2                      # the S2S test client
         zstd                            # zstd request bodies (tests/http)
         clang libclang-rt-14-dev        # libFuzzer for scripts/fuzz.sh
         libtsan2                        # ThreadSanitizer runtime for scripts/tsan.sh
         gdb                             # thread stacks of a server that does not stop (test harnesses)
         kcat librdkafka-dev python3-confluent-kafka  # Kafka client suites (tests/kafka), weir_kafka_bench
         )
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
$tests || exit 0
# The SDK, kafkajs and Flight suites (tests/js, tests/kafka/js, tests/flight/js) need Node.js 20+ and npm (S2's SDK asks for 20),
# newer than Debian 12's nodejs: these machines carry it outside Debian's packages, so it is checked only.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "deps: node and npm are needed for tests/js, tests/kafka/js and tests/flight/js (Node.js 20 or newer)" >&2
  exit 1
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "deps: Node.js $(node --version) is too old for tests/js; need 20 or newer" >&2
  exit 1
fi
