#!/usr/bin/env bash
# Mallocs a proxied request costs the router, by protocol: a unary gRPC
# ModelInfer, a KServe REST infer over HTTP/2 (h2c) and over HTTP/1.1, each
# through one router loop to a `gpuha worker`, driven by h2load. The router
# runs under an LD_PRELOAD malloc counter (bench/lib/malloc_count.c) twice,
# with N and 3N requests; the difference over 2N is the cost of a request,
# start-up and warm-up left out. Deterministic, unlike a timing on this
# shared machine: the figure to compare before and after a change.
#   bench/router_allocs.sh GPUHA_BINARY [N]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gpuha="$(realpath "${1:?usage: router_allocs.sh GPUHA_BINARY [N]}")"
n="${2:-10000}"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "N must be a positive integer, got '$n'" >&2; exit 2; }
for tool in h2load gcc python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-allocs.XXXXXX)"
pids=()
# shellcheck source=bench/lib/procs.sh
source "$here/lib/procs.sh"
cleanup() { stop_procs "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
WORKER_HTTP=19421 WORKER_GRPC=19422 ROUTER=19425
require_free_ports $WORKER_HTTP $WORKER_GRPC $ROUTER

gcc -O2 -shared -fPIC -o "$work/malloc_count.so" "$here/lib/malloc_count.c"
# One ModelInfer call, gRPC-framed.
python3 "$here/lib/model_infer_call.py" "$work/call.bin"
printf '%s' '{"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,1,3],"data":[1,2,3]}]}' \
  > "$work/infer.json"
"$gpuha" worker --listen 127.0.0.1:$WORKER_HTTP --grpc-listen 127.0.0.1:$WORKER_GRPC --latency 0 \
  --threads 2 --capacity 100000 --node w >/dev/null 2>"$work/worker.err" & pids+=($!)
cat > "$work/router.yaml" <<CONF
listen: 127.0.0.1:$ROUTER
admin: 127.0.0.1:0
threads: 1
auth: none
limits: {h2_max_concurrent_streams: 1024}
routes:
  - {stream: s1, primary: 127.0.0.1:$WORKER_HTTP, primary_grpc: 127.0.0.1:$WORKER_GRPC}
CONF
sleep 0.5

# count REQUESTS H2LOAD_ARGS...: the router's mallocs over a run of REQUESTS.
count() {
  local requests="$1"; shift
  MALLOC_COUNT_OUT="$work/count" LD_PRELOAD="$work/malloc_count.so" \
    "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" &
  local rpid=$!
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$ROUTER") 2>/dev/null && break; sleep 0.05; done
  local out
  out="$(h2load -n "$requests" -c 16 -m 8 "$@")"
  stop_procs "$rpid"
  if ! grep -q "status codes: $requests 2xx" <<<"$out"; then
    echo "not every request answered 2xx:" >&2
    echo "$out" >&2
    exit 1
  fi
  cat "$work/count"
}

echo "| request | mallocs a request | router total at $n / $((3 * n)) |"
echo "|---|---:|---|"
for row in grpc rest-h2 rest-h1; do
  case "$row" in
    grpc) title="gRPC ModelInfer (unary)"
      args=(-d "$work/call.bin" -H 'content-type: application/grpc' -H 'te: trailers'
            -H 'x-gpuha-stream: s1' "http://127.0.0.1:$ROUTER/inference.GRPCInferenceService/ModelInfer") ;;
    rest-h2) title="KServe REST infer over HTTP/2 (h2c)"
      args=(-d "$work/infer.json" -H 'content-type: application/json'
            "http://127.0.0.1:$ROUTER/streams/s1/v2/models/cv/infer") ;;
    rest-h1) title="KServe REST infer over HTTP/1.1"
      args=(--h1 -d "$work/infer.json" -H 'content-type: application/json'
            "http://127.0.0.1:$ROUTER/streams/s1/v2/models/cv/infer") ;;
  esac
  a="$(count "$n" "${args[@]}")"
  b="$(count $((3 * n)) "${args[@]}")"
  awk -v t="$title" -v a="$a" -v b="$b" -v n="$n" \
    'BEGIN {printf "| %s | %.1f | %d / %d |\n", t, (b - a) / (2 * n), a, b}'
done
