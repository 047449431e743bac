#!/usr/bin/env bash
# Soak: the router's progress verdict must not fire on a healthy fleet.
# SECONDS of open-loop load at RATE req/s through the gpuha router to three
# healthy gpuha-test-backend upstreams (20 streams, primaries A and B,
# standby C), 2% of requests legitimately slow (1.5 s), and every 30 s a
# 5-second burst that adds 2x RATE (3x in all). At the end the router's
# /metrics must show no stall and no ejection, and the load no failure.
# TEST_BACKEND may be bench/backends/asyncio_backend.py (run with python3):
# it closes idle keep-alive connections after 5 s, as uvicorn does.
#   bench/router_soak.sh GPUHA_BINARY TEST_BACKEND [SECONDS] [RATE]
set -euo pipefail
source "$(dirname "$0")/lib/static_router.sh"
gpuha="$(realpath "${1:?usage: router_soak.sh GPUHA_BINARY TEST_BACKEND [SECONDS] [RATE]}")"
backend="$(realpath "${2:?test backend binary}")"
secs="${3:-600}"
rate="${4:-300}"
work="$(mktemp -d /tmp/gpuha-soak.XXXXXX)"
pids=()
# The work folder (router log, reports) is kept when the soak fails.
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ $rc -eq 0 ]]; then rm -rf "$work"; else echo "kept $work" >&2; fi
}
trap cleanup EXIT
A=19501 B=19502 C=19503 PROXY=19510 ADMIN=19511
for p in $A $B $C; do
  if [[ $backend == *.py ]]; then
    python3 "$backend" --name "$p" --port "$p" >/dev/null & pids+=($!)
  else
    "$backend" --name "$p" --port "$p" --threads 1 >/dev/null & pids+=($!)
  fi
done
static_router_yaml "$work/router.yaml" $PROXY $A $B $C $ADMIN
"$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & pids+=($!)
sleep 1
load() {  # $1 = rate, $2 = seconds, $3 = report; failures are counted below
  "$gpuha" load --target 127.0.0.1:$PROXY --streams 20 --rate "$1" --seconds "$2" --timeout 5 \
    --slow-fraction 0.02 --slow-query delay_ms=1500 --quiet --json "$3" >"$3.out" 2>&1 || true
}
load "$rate" "$secs" "$work/base.json" & base=$!
bursts=0
for ((t = 30; t + 5 <= secs; t += 30)); do
  sleep 25
  load $((rate * 2)) 5 "$work/burst-$bursts.json"
  bursts=$((bursts + 1))
done
wait "$base" || true
curl -s "http://127.0.0.1:$ADMIN/metrics" > "$work/metrics.txt"
python3 - "$work" "$bursts" "$secs" "$rate" <<'PY'
import glob, json, re, sys
work, bursts, secs, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
reports = [json.load(open(p)) for p in [f"{work}/base.json"] + sorted(glob.glob(f"{work}/burst-*.json"))]
metrics = open(f"{work}/metrics.txt").read()
def metric(name):
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", metrics, re.M)
    return float(m.group(1)) if m else float("nan")
sent = sum(r["sent"] for r in reports)
failed = sum(r["failed"] for r in reports)
stale = sum(r["stale_retries"] for r in reports)
slow_sent = sum(r["slow_sent"] for r in reports)
slow_ok = sum(r["slow_ok"] for r in reports)
stalls, ejections = metric("gpuha_router_stalls_total"), metric("gpuha_router_ejections_total")
failures = {}
for r in reports:
    for k, v in r["failures"].items():
        failures[k] = failures.get(k, 0) + v
print(f"soak {secs} s at {rate} req/s, {bursts} bursts to 3x: sent {sent}, failed {failed} "
      f"{failures or ''}, slow {slow_ok} of {slow_sent} answered, stalls {stalls:.0f}, "
      f"ejections {ejections:.0f}, stale keep-alive re-sends {stale}, p99 {reports[0]['latency_ms']['p99']:.1f} ms, "
      f"longest gap {max(r['max_gap_ms'] for r in reports):.1f} ms")
sys.exit(0 if failed == 0 and stalls == 0 and ejections == 0 and slow_ok == slow_sent else 1)
PY
