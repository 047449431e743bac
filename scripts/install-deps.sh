#!/usr/bin/env bash
# Installs every Debian package gpuha needs to build, test and benchmark.
#   scripts/install-deps.sh           everything (make test, make bench)
#   scripts/install-deps.sh --build   only what building the binary and its
#                                     .deb needs (the container's build stage)
# Idempotent: packages already present are skipped, and apt-get update runs at
# most once per invocation, only when something is missing.
set -euo pipefail

# Each package is here for a reason; DESIGN.md lists the dependencies.
BUILD_PACKAGES=(
  build-essential     # g++ 12
  cmake ninja-build   # build
  pkg-config
  libcli11-dev        # command line
  libyaml-cpp-dev     # config and planner input
  nlohmann-json3-dev  # API bodies and JSON reports
  libspdlog-dev       # structured log lines
  libsqlite3-dev      # the controller's embedded store
  libabsl-dev         # Status / StatusOr (also a gRPC dependency)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler  # agent/controller RPC
  libboost-dev        # Asio and Beast: HTTP endpoints and the router
  libssl-dev          # TLS
  libnghttp2-dev      # HTTP/2: the router's codec for h2c, h2 by ALPN, and gRPC to upstreams
  libgtest-dev libgmock-dev  # unit tests (CMake configures them with the rest)
  dpkg-dev file binutils     # make package: CPack's .deb, dpkg-shlibdeps, the split debug info
)
TEST_PACKAGES=(
  openssl             # tests make their own CA and certificates for mTLS
  libbenchmark-dev    # micro benchmarks
  clang libclang-rt-14-dev   # sanitizers and libFuzzer
  curl                # tests and the demo talk to the router like a user would
  nginx-light haproxy wrk    # benchmark peers of the router (bench/), never run by tests
  nghttp2-client             # h2load: the gRPC benchmark's load generator (bench/)
  iproute2            # the partition chaos test: network namespaces and veth pairs
  chromium-headless-shell    # the dashboard test loads the page in a real browser
  systemd                    # systemd-analyze verify checks the packaged units
  python3 python3-yaml       # the package test and the Kubernetes manifest test
  prometheus                 # promtool: the alert rules' tests, every /metrics page checked
  zsh fish                   # `gpuha completion` scripts run in the shells they are for
  etcd-server                # the controller's etcd store and leadership, tested on a real etcd
  keepalived                 # the routers' shared address (VRRP), tested in network namespaces
)

case "${1:-}" in
  "") PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  --build) PACKAGES=("${BUILD_PACKAGES[@]}") ;;
  *) echo "install-deps: unknown argument '$1' (expected nothing or --build)" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
