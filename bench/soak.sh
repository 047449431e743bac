#!/usr/bin/env bash
# Soak: N healthy `gpuha agent` processes (simulated GPUs, 50 ms heartbeats)
# against one `gpuha controller` for T seconds on this machine. A healthy
# cluster must see no failover at all: prints the failovers, suspects and the
# controller's and agents' CPU, and exits 1 if any node was failed over.
# Usage: bench/soak.sh GPUHA_BINARY [agents=100] [seconds=600]
set -euo pipefail
gpuha=$(realpath "$1"); agents=${2:-100}; seconds=${3:-600}
dir=$(mktemp -d /tmp/gpuha-soak.XXXXXX)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

{
  echo "cluster: { redundancy: 1 }"
  echo "nodes:"
  for i in $(seq 1 "$agents"); do echo "  - { name: s$i, capacity: 10 }"; done
  echo "listen: { grpc: \"127.0.0.1:0\", http: \"127.0.0.1:0\" }"
} > "$dir/c.yaml"
"$gpuha" controller --config "$dir/c.yaml" > "$dir/controller.out" 2> "$dir/controller.err" &
cpid=$!; pids+=("$cpid")
for _ in $(seq 100); do grep -q "gpuha controller grpc" "$dir/controller.out" && break; sleep 0.1; done
read -r grpc http < <(sed -n 's/.*grpc 127.0.0.1:\([0-9]*\) http 127.0.0.1:\([0-9]*\).*/\1 \2/p' "$dir/controller.out")
for i in $(seq 1 "$agents"); do
  "$gpuha" agent --node "s$i" --controller "127.0.0.1:$grpc" --gpu sim \
    > /dev/null 2>> "$dir/agents.err" &
  pids+=("$!")
done
sleep 5  # everyone connected
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
c0=$(ticks "$cpid"); a0=0; for p in "${pids[@]:1}"; do a0=$((a0 + $(ticks "$p"))); done
start=$(date +%s)
sleep "$seconds"
wall=$(( $(date +%s) - start ))
c1=$(ticks "$cpid"); a1=0; for p in "${pids[@]:1}"; do a1=$((a1 + $(ticks "$p"))); done
hz=$(getconf CLK_TCK)
events=$("$gpuha" ctl --controller "http://127.0.0.1:$http" --json events)
count() { grep -o "\"type\": \"$1\"" <<<"$events" | wc -l || true; }  # grep finds none: 0
detected=$(count detected)
suspects=$(count suspect)
connected=$(count agent_connected)
echo "soak: $agents agents, ${wall} s, agent connections $connected"
echo "soak: failovers (detected events) $detected, suspect events $suspects"
awk -v c=$((c1 - c0)) -v a=$((a1 - a0)) -v hz="$hz" -v w="$wall" -v n="$agents" 'BEGIN {
  printf "soak: controller CPU %.2f%% of one core; agents %.2f%% of one core in all (%.3f%% each)\n",
         100*c/hz/w, 100*a/hz/w, 100*a/hz/w/n }'
[ "$detected" -eq 0 ]
