#!/usr/bin/env bash
# Floods against real processes, the router's memory and the controller's
# failovers measured while good clients run through them (bench/lib/floods.py
# writes the hostile side by hand):
#   router: gRPC streams that keep their window shut and send as fast as the
#           router lets them (4 connections, 20 s); unary calls that never end
#           their body and PING every 100 ms (8 connections x 16 calls, with
#           limits.body_timeout_ms 3000). Router RSS sampled every 0.5 s.
#   controller: `gpuha demo --keep` (4 agents, the router, KServe load), then
#           1,400-byte datagrams carrying a session number sniffed off
#           loopback and a random MAC, from 3 processes for 6 s; then 2,400
#           requests naming a model nobody serves. Failovers counted.
#   bench/hostile_floods.sh GPUHA_BINARY          (root: the sniff needs a packet socket)
set -euo pipefail
gpuha="$(realpath "${1:?usage: hostile_floods.sh GPUHA_BINARY}")"
here="$(cd "$(dirname "$0")" && pwd)"
floods="$here/lib/floods.py"
work="$(mktemp -d /tmp/gpuha-floods.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pkill -f "$work/" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=bench/lib/procs.sh
source "$here/lib/procs.sh"
ROUTER=19501 ADMIN=19502 W1=19503 W1G=19504 W2=19505 W2G=19506
require_free_ports $ROUTER $ADMIN $W1 $W1G $W2 $W2G

"$gpuha" worker --listen 127.0.0.1:$W1 --grpc-listen 127.0.0.1:$W1G --node a --latency 2 \
  >/dev/null 2>"$work/w1.err" & pids+=($!)
"$gpuha" worker --listen 127.0.0.1:$W2 --grpc-listen 127.0.0.1:$W2G --node b --latency 2 \
  >/dev/null 2>"$work/w2.err" & pids+=($!)
cat > "$work/router.yaml" <<CONF
listen: 127.0.0.1:$ROUTER
admin: 127.0.0.1:$ADMIN
threads: 2
limits: { body_timeout_ms: 3000 }
tenants:
  - { name: acme, api_keys_sha256: ["$("$gpuha" ctl hash-token k1)"] }
routes:
  - { stream: cam-0, tenant: acme, primary: "127.0.0.1:$W1", standby: "127.0.0.1:$W2",
      primary_grpc: "127.0.0.1:$W1G", standby_grpc: "127.0.0.1:$W2G" }
CONF
"$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & router=$!
pids+=($router)
sleep 1.5

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$router/status"; }
# flood NAME SECONDS floods.py-args...: the flood beside a good gRPC client,
# one Markdown row: RSS before, peak, 2 s after; the good client's count.
flood() {
  local name="$1" secs="$2"; shift 2
  "$gpuha" load --target "127.0.0.1:$ROUTER" --protocol grpc --streams 1 --rate 100 \
    --seconds "$((secs + 2))" --key k1 --quiet --json "$work/good-$name.json" >/dev/null 2>&1 &
  local good=$!
  local before; before=$(rss)
  python3 "$floods" "$@" > "$work/$name.json" & local f=$!
  local peak=$before
  while kill -0 "$f" 2>/dev/null; do
    local now; now=$(rss); (( now > peak )) && peak=$now
    sleep 0.5
  done
  wait "$f"; sleep 2
  local after; after=$(rss)
  wait "$good" || true
  python3 - "$name" "$before" "$peak" "$after" "$work/$name.json" "$work/good-$name.json" <<'PY'
import json, sys
name, before, peak, after = sys.argv[1], *map(int, sys.argv[2:5])
f, g = json.load(open(sys.argv[5])), json.load(open(sys.argv[6]))
what = ", ".join(f"{k} {v}" for k, v in f.items() if k != "flood")
print(f"| {name} | {what} | {before/1024:.1f} | {peak/1024:.1f} | {after/1024:.1f} | "
      f"{g['ok']} ok, {g['failed']} failed |")
PY
}
echo "| router flood | what it sent | RSS before, MB | peak | 2 s after | good gRPC client |"
echo "|---|---|---:|---:|---:|---|"
flood window-shut 20 window-shut $ROUTER 4 20
flood ping-holder 8 ping-holder $ROUTER 8 8
stop_procs "${pids[@]}"; pids=()

# The controller: a demo cluster left running.
"$gpuha" demo --faults "" --keep --workdir "$work/demo" --llm-streams 0 --grpc-streams 0 \
  > "$work/demo.out" 2>&1 & pids+=($!)
for _ in $(seq 120); do grep -q "keeps running" "$work/demo.out" && break; sleep 0.5; done
rport=$(sed -n 's|.*router: *http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$work/demo.out")
api=$(sed -n 's|.*operator API: http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$work/demo.out")
udp=$(sed -n 's|.*grpc: "127.0.0.1:\([0-9]*\)".*|\1|p' "$work/demo/controller.yaml")
key=$(sed -n 's|.*(X-Api-Key: \([^)]*\)).*|\1|p' "$work/demo.out")
metric() { curl -s "127.0.0.1:$api/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
session=$(timeout 15 python3 "$floods" sniff "$udp")
echo
echo "| controller flood | sent | failovers | datagrams refused | dropped by the kernel | good KServe load |"
echo "|---|---|---:|---:|---:|---|"
f0=$(metric gpuha_controller_failovers_total); r0=$(metric gpuha_controller_datagrams_refused_total)
d0=$(metric gpuha_controller_datagrams_dropped_total)
"$gpuha" load --target "127.0.0.1:$rport" --key "$key" --streams 20 --rate 400 --seconds 9 --infer \
  --quiet --json "$work/udp-good.json" >/dev/null 2>&1 & good=$!
sleep 1
senders=()
for _ in 1 2 3; do python3 "$floods" udp "$udp" 6 "$session" >> "$work/udp.json" & senders+=($!); done
wait "${senders[@]}"
wait "$good" || true; sleep 1
sent=$(python3 -c "import json,sys; print(sum(json.loads(l)['datagrams_sent'] for l in open(sys.argv[1])))" "$work/udp.json")
good=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(f\"{j['ok']} ok, {j['failed']} failed\")" "$work/udp-good.json")
echo "| UDP, 3 senders, 6 s, a real session, random MAC | $sent | $(( $(metric gpuha_controller_failovers_total) - f0 )) | $(( $(metric gpuha_controller_datagrams_refused_total) - r0 )) | $(( $(metric gpuha_controller_datagrams_dropped_total) - d0 )) | $good |"
f0=$(metric gpuha_controller_failovers_total)
"$gpuha" load --target "127.0.0.1:$rport" --key "$key" --streams 20 --rate 400 --seconds 6 \
  --path /v2/models/m/infer --method POST --body '{}' --quiet --json "$work/bad.json" >/dev/null 2>&1 || true
sleep 3
bad=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['ok'] + j['failed'])" "$work/bad.json")
echo "| requests for a model nobody serves (404), quiet nodes | $bad | $(( $(metric gpuha_controller_failovers_total) - f0 )) | | | |"
