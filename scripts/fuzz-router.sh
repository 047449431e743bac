#!/usr/bin/env bash
# Builds the router's libFuzzer targets with clang (ASan + UBSan) and runs
# them for a bounded time, a quarter each. `make test` runs it through ctest for 30 s.
#   router_request_fuzz  the request path: client bytes through Beast's
#                        parser and every head helper
#   sse_relay_fuzz       the LLM relay: an upstream's token stream, cut and
#                        continued (router/sse_relay.h)
#   h2_server_fuzz       the HTTP/2 frame path: client bytes through nghttp2
#                        with the router's limits (router/h2_server.h)
#   upstream_answer_fuzz an upstream's bytes on a kept-alive connection, read
#                        as the router reads an answer, and its rule for
#                        reusing the connection: no byte of one answer may
#                        reach another request (router/request.h)
#   scripts/fuzz-router.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
secs="${1:-30}"
out="${2:-build/fuzz}"
root="$(cd "$(dirname "$0")/.." && pwd)"
flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I"$root/src")

# build NAME SOURCES... -- LIBS...: rebuilt when any source or header it names is newer.
build() {
  local name=$1
  shift
  local srcs=() libs=() deps=()
  while [[ $# -gt 0 && $1 != -- ]]; do srcs+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  libs=("$@")
  local bin="$out/$name"
  for s in "${srcs[@]}"; do deps+=("$s" "${s%.cc}.h"); done
  local stale=0
  [[ -x "$bin" ]] || stale=1
  for d in "${deps[@]}"; do [[ -f "$d" && "$d" -nt "$bin" ]] && stale=1; done
  if [[ $stale == 1 ]]; then
    clang++ "${flags[@]}" "${srcs[@]}" -o "$bin" "${libs[@]}"
  fi
}

mkdir -p "$out/corpus/router_request" "$out/corpus/sse_relay" "$out/corpus/h2_server" \
  "$out/corpus/upstream_answer"
build router_request_fuzz "$root/fuzz/router_request_fuzz.cc" "$root/src/router/request.cc"
build upstream_answer_fuzz "$root/fuzz/upstream_answer_fuzz.cc" "$root/src/router/request.cc"
# Abseil's strings and status are the one library the relay needs
# (Debian's libabsl-dev, which the build already uses).
build sse_relay_fuzz "$root/fuzz/sse_relay_fuzz.cc" "$root/src/router/sse_relay.cc" \
  "$root/src/common/sse.cc" -- -labsl_strings -labsl_status -labsl_statusor -labsl_str_format_internal \
  -labsl_cord -labsl_raw_logging_internal -labsl_throw_delegate -labsl_int128 -labsl_strings_internal

# nghttp2 (Debian's libnghttp2-dev) is the codec under test with our limits.
# (request.cc: the HTTP answer a REST stream over the limits gets.)
build h2_server_fuzz "$root/fuzz/h2_server_fuzz.cc" "$root/src/router/h2_server.cc" \
  "$root/src/router/grpc.cc" "$root/src/router/request.cc" -- -lnghttp2 -labsl_strings -labsl_status -labsl_statusor \
  -labsl_str_format_internal -labsl_cord -labsl_raw_logging_internal -labsl_throw_delegate \
  -labsl_int128 -labsl_strings_internal

quarter=$(( secs / 4 > 0 ? secs / 4 : 1 ))
# New inputs go to the build directory; the checked-in seeds stay read-only.
for name in router_request sse_relay h2_server upstream_answer; do
  "$out/${name}_fuzz" -max_total_time="$quarter" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    "$out/corpus/$name" "$root/fuzz/corpus/$name"
done
