#!/usr/bin/env bash
# bench/failover: issue 6's failover figures. First the whole system (`gpuha
# demo`, medians over RUNS runs), then the same crash and hang against nginx
# and HAProxy with a backup server, each at its defaults and tuned, next to
# the gpuha router, in one run (bench/router_failover.sh).
#   bench/failover.sh BUILD_DIR [RUNS]
set -euo pipefail
build="${1:?usage: failover.sh BUILD_DIR [RUNS]}"
runs="${2:-10}"
echo "## gpuha demo, median over $runs runs"
"$build/bench/failover_bench" "$build/gpuha" "$runs"
echo
echo "## side by side with nginx and HAProxy (one run)"
"$(dirname "$0")/router_failover.sh" "$build/gpuha" "$build/gpuha-test-backend" 12 1000
