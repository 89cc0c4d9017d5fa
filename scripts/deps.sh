#!/usr/bin/env bash
# Installs the Debian 12 packages weir needs to build and test, if missing.
# Runs `apt-get update` once, only when something has to be installed.
set -euo pipefail
pkgs=(g++ cmake ninja-build ccache pkg-config python3
      libisal-dev libsqlite3-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev
      libcurl4-openssl-dev libssl-dev libexpat1-dev curl radosgw ceph-mon ceph-osd  # s3://, and radosgw for its tests
      libboost-dev     # Boost.Asio/Beast for the HTTP server (headers only)
      libsimdjson-dev) # the append body parser
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
