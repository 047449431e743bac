#!/usr/bin/env bash
# Builds the router's libFuzzer target with clang (ASan + UBSan) and runs it
# for a bounded time. `make test` runs it through ctest for 30 s.
#   scripts/fuzz-router.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
secs="${1:-30}"
out="${2:-build/fuzz}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out/corpus"
bin="$out/router_request_fuzz"
if [[ ! -x "$bin" || "$root/fuzz/router_request_fuzz.cc" -nt "$bin" || \
      "$root/src/router/request.cc" -nt "$bin" || "$root/src/router/request.h" -nt "$bin" ]]; then
  clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$root/src" "$root/fuzz/router_request_fuzz.cc" "$root/src/router/request.cc" -o "$bin"
fi
# New inputs go to the build directory; the checked-in seeds stay read-only.
exec "$bin" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
  "$out/corpus" "$root/fuzz/corpus/router_request"
