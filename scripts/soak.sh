#!/usr/bin/env bash
# Runs tests again and again with the machine loaded, to find what a busy
# host shows and a quiet one hides (a flaky test is a product bug until a
# run shows it is the test's). Used before each submission that touches
# the data path; the counts go to bench/RESULTS.md.
#
#   scripts/soak.sh [-n RUNS] [-b BUILD_DIR] [-j JOBS] [--hogs N] [-- CTEST_ARGS...]
#
#   -n RUNS       runs of the selection (default 5)
#   -b BUILD_DIR  a configured and built tree (default build-e2e, else build)
#   -j JOBS       ctest's parallel jobs (default: the number of cores)
#   --hogs N      busy loops beside the tests (default 1: one core taken)
#   CTEST_ARGS    the selection (default: -L e2e); e.g. -- -R ChaosTest
#
# Every run's output is kept in a folder it prints; a failing test's own
# files (its cluster's logs) are kept where the output says ("[  FILES   ]").
# Exits 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5 build="" jobs="$(nproc)" hogs=1
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs="$2"; shift 2 ;;
    -b) build="$2"; shift 2 ;;
    -j) jobs="$2"; shift 2 ;;
    --hogs) hogs="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "soak: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
ctest_args=("$@")
[ ${#ctest_args[@]} -eq 0 ] && ctest_args=(-L e2e)
if [ -z "$build" ]; then
  build=build-e2e
  [ -f "$build/CTestTestfile.cmake" ] || build=build
fi
[ -f "$build/CTestTestfile.cmake" ] || { echo "soak: $build is not a built tree (make build)" >&2; exit 2; }

out="$(mktemp -d /tmp/gpuha-soak.XXXXXX)"
pids=()
stop_hogs() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for ((h = 0; h < hogs; h++)); do
  (while :; do :; done) &
  pids+=($!)
done
echo "soak: $runs run(s) of ctest ${ctest_args[*]} in $build, -j $jobs, $hogs busy loop(s); output in $out"
failed_runs=0
start=$(date +%s)
for ((i = 1; i <= runs; i++)); do
  log="$out/run-$i.log"
  t0=$(date +%s)
  if (cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 300 "${ctest_args[@]}") >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed_runs=$((failed_runs + 1))
  fi
  summary="$(grep -E 'tests passed, [0-9]+ tests failed' "$log" || echo 'no summary')"
  echo "soak: run $i/$runs: $status, $summary ($(($(date +%s) - t0)) s)"
  grep -E '^\s+[0-9]+ - .* \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)' "$log" | sed 's/^/soak:   /' || true
  grep -E '^\[  FILES   \]' "$log" | sed 's/^/soak:   /' || true
done
echo "soak: $((runs - failed_runs))/$runs run(s) passed in $(($(date +%s) - start)) s; output in $out"
[ "$failed_runs" -eq 0 ]
