#!/usr/bin/env bash
# The agent's CPU with 8 GPUs at the default cadence (sampling every
# 500 ms, heartbeats every 50 ms), each backend measured in the same run
# for ROUNDS rounds of SECONDS each, interleaved so that the machine's
# noise falls on all of them alike:
#   sim              the sim backend, free readings: the agent's own base
#   sim-cost         the sim backend with gpu.sim.cost_model
#   nvml             the NVML backend on the cost-modelled fake library
#   nvml-stream      the same with every heartbeat on the gRPC stream (the
#                    controller offers no heartbeat datagrams)
#   nvml-every-call  the same as nvml-stream, every call every sample and
#                    PCIe throughput from the 20.8 ms call: the agent before
#                    issue 38
# Prints each run's row and, per backend, the median and range.
#   bench/agent_cost.sh AGENT_BENCH GPUHA_BINARY [SECONDS] [ROUNDS]
set -euo pipefail
bench="$(realpath "${1:?usage: agent_cost.sh AGENT_BENCH GPUHA_BINARY [SECONDS] [ROUNDS]}")"
gpuha="$(realpath "${2:?gpuha binary}")"
secs="${3:-60}"
rounds="${4:-3}"
declare -A runs
for round in $(seq "$rounds"); do
  for mode in sim sim-cost nvml nvml-stream nvml-every-call; do
    env=(AGENT_BENCH_GPU="${mode%%-*}")
    [[ "$mode" == sim-cost ]] && env=(AGENT_BENCH_GPU=sim-cost)
    [[ "$mode" == sim ]] && env=()
    [[ "$mode" == nvml-stream ]] && env+=(AGENT_BENCH_DATAGRAMS=0)
    [[ "$mode" == nvml-every-call ]] &&
      env+=(AGENT_BENCH_SLOW_MS=0 AGENT_BENCH_NO_PCIE_COUNTERS=1 AGENT_BENCH_DATAGRAMS=0)
    out="$(env ${env[@]+"${env[@]}"} "$bench" "$gpuha" "$secs" 20 0 500)"
    row="$(grep 'agent CPU' <<<"$out")"
    pct="$(sed -E 's/.*\| ([0-9.]+)% of one core.*/\1/' <<<"$row")"
    xid="$(grep 'median' <<<"$out" | sed -E 's/^[^|]*\|[^|]*\| ([0-9.]+) ms.*/\1/')"
    echo "round $round $mode: ${pct}% of a core, XID to heartbeat median ${xid} ms"
    runs[$mode]+="$pct "
  done
done
echo
echo "| backend (8 GPUs, sample 500 ms, heartbeat 50 ms) | agent CPU, median of $rounds x ${secs} s | range |"
echo "|---|---|---|"
for mode in sim sim-cost nvml nvml-stream nvml-every-call; do
  read -r -a v <<<"${runs[$mode]}"
  sorted=($(printf '%s\n' "${v[@]}" | sort -g))
  echo "| $mode | ${sorted[$(( ${#sorted[@]} / 2 ))]}% | ${sorted[0]}-${sorted[-1]}% |"
done
