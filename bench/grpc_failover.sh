#!/usr/bin/env bash
# Failover of KServe v2 calls through the router, gRPC (unary ModelInfer over
# HTTP/2, and ModelStreamInfer streams: a call per stream, each request a
# message on it, answered once and in order) beside HTTP/1.1
# (POST /v2/models/cv/infer) in the same run, under
# the same open-loop load from `gpuha load` (every answer checked against
# the model). Two `gpuha worker` processes: A primary, B standby, for 4
# streams. FAULT_AT seconds in, A gets kill -9 (crash), SIGSTOP (hang) or the
# `stuck` fault (half-hang: health answers, inference does not move). Each
# protocol and fault gets fresh workers and a fresh router.
#   bench/grpc_failover.sh GPUHA_BINARY [SECONDS] [RATE]
# Prints a Markdown table for bench/RESULTS.md.
set -euo pipefail
source "$(dirname "$0")/lib/procs.sh"
gpuha="$(realpath "${1:?usage: grpc_failover.sh GPUHA_BINARY [SECONDS] [RATE]}")"
secs="${2:-8}"
rate="${3:-400}"
fault_at="${FAULT_AT:-3}"
for v in secs rate fault_at; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "${v^^} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "missing python3: run scripts/install-deps.sh" >&2; exit 2; }
work="$(mktemp -d /tmp/gpuha-grpc-failover.XXXXXX)"
pids=()
cleanup() { stop_procs "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
A=19501 AG=19502 B=19503 BG=19504 ROUTER=19510

run_one() {  # $1 protocol (http|grpc|grpc-stream), $2 fault
  local proto="$1" fault="$2"
  "$gpuha" worker --listen 127.0.0.1:$A --grpc-listen 127.0.0.1:$AG --node a --latency 2 >/dev/null 2>&1 & local a=$!
  "$gpuha" worker --listen 127.0.0.1:$B --grpc-listen 127.0.0.1:$BG --node b --latency 2 >/dev/null 2>&1 & local b=$!
  pids+=($a $b)
  {
    echo "listen: 127.0.0.1:$ROUTER"
    echo "admin: 127.0.0.1:0"
    echo "threads: 2"
    echo "auth: none"
    echo "routes:"
    for i in 0 1 2 3; do
      echo "  - {stream: cam-$i, primary: 127.0.0.1:$A, standby: 127.0.0.1:$B, primary_grpc: 127.0.0.1:$AG, standby_grpc: 127.0.0.1:$BG}"
    done
    echo "failover: {probe_interval_ms: 100, hang_after_ms: 500}"
  } > "$work/router.yaml"
  "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & local r=$!
  pids+=($r)
  sleep 0.7
  local flags=(--protocol "$proto")
  [[ $proto == http ]] && flags=(--infer)
  "$gpuha" load --target 127.0.0.1:$ROUTER --streams 4 --rate "$rate" --seconds "$secs" \
    --image-side 8 --quiet --json "$work/report.json" "${flags[@]}" >/dev/null &
  local l=$!
  sleep "$fault_at"
  case "$fault" in
    crash) kill -9 $a ;;
    hang) kill -STOP $a ;;
    half-hang) curl -s -X POST "http://127.0.0.1:$A/v1/fault?mode=stuck" >/dev/null ;;
  esac
  wait $l || true
  kill -CONT $a 2>/dev/null || true
  kill -9 $a $b $r 2>/dev/null || true
  wait $a $b $r 2>/dev/null || true
  python3 - "$work/report.json" "$proto" "$fault" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fails = ", ".join(f"{k} {v}" for k, v in r["failures"].items()) or "-"
by = " ".join(f"{k}={v}" for k, v in sorted(r["served_by"].items()))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['sent']} | {r['failed']} | {r['max_gap_ms']:.1f} | "
      f"{r['max_stall_ms']:.1f} | {r['latency_ms']['p99']:.1f} | {by} | {fails} |")
PY
}

echo "| protocol | fault | sent | failed | longest gap ms | longest stall ms | p99 ms | served by | failures |"
echo "|---|---|---|---|---|---|---|---|---|"
for fault in ${FAULTS:-crash hang half-hang}; do
  for proto in http grpc grpc-stream; do run_one "$proto" "$fault"; done
done
