#!/usr/bin/env bash
# The dashboard after a demo fault, in real headless Chromium: runs
# `gpuha demo --keep --train` (the training job's node crashes under checked
# load), loads the page at `/`, fails unless each traffic graph drew points
# with data and the jobs table shows the job running again, and writes a
# screenshot.
#   scripts/dashboard-screenshot.sh build/gpuha docs/dashboard.png
# ctest runs it (dashboard.screenshot) with the picture in the build folder;
# docs/dashboard.png was made by this command.
set -euo pipefail
gpuha="$1"
png="$2"
chromium=/usr/bin/chromium-headless-shell
work="$(mktemp -d)"
demo_pid=""
cleanup() {
  if [ -n "$demo_pid" ]; then kill -INT "$demo_pid" 2>/dev/null || true; wait "$demo_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$gpuha" demo --keep --train --faults train-crash --observe-ms 3000 --workdir "$work/demo" >"$work/demo.out" 2>"$work/demo.err" &
demo_pid=$!
port=""
for _ in $(seq 1 240); do
  port="$(sed -n 's|^  dashboard: *http://127.0.0.1:\([0-9]*\)/$|\1|p' "$work/demo.out")"
  [ -n "$port" ] && break
  if ! kill -0 "$demo_pid" 2>/dev/null; then
    echo "dashboard-screenshot: the demo exited early:" >&2
    cat "$work/demo.out" "$work/demo.err" >&2
    exit 1
  fi
  sleep 0.5
done
if [ -z "$port" ]; then
  echo "dashboard-screenshot: the demo never printed its dashboard address" >&2
  exit 1
fi
url="http://127.0.0.1:$port/"
browser=("$chromium" --no-sandbox --disable-gpu --no-first-run --hide-scrollbars
         "--user-data-dir=$work/chromium" --virtual-time-budget=3000)
"${browser[@]}" --dump-dom "$url" >"$work/dom.html" 2>"$work/chromium.err"
ok=1
for graph in g-requests g-p99 g-failovers; do
  line="$(grep -o "id=\"$graph\" data-points=\"[0-9]*\" data-max=\"[-0-9.e+]*\"" "$work/dom.html" || true)"
  points="$(echo "$line" | sed -n 's/.*data-points="\([0-9]*\)".*/\1/p')"
  max="$(echo "$line" | sed -n 's/.*data-max="\([-0-9.e+]*\)".*/\1/p')"
  least=2
  [ "$graph" = g-p99 ] && least=1  # a point only where something was answered
  if [ -z "$points" ] || [ "$points" -lt "$least" ] || ! awk -v m="$max" 'BEGIN { exit !(m > 0) }'; then
    echo "FAIL     graph $graph: ${points:-no} points, max ${max:-none}" >&2
    ok=0
  else
    echo "ok       graph $graph: $points points, max $max"
  fi
done
[ "$ok" = 1 ] || { echo "the dashboard's graphs have no data" >&2; exit 1; }
# The jobs table: the demo's job, running again after its node's crash.
if grep -q '<td>train-demo</td><td class="ok">running</td>' "$work/dom.html"; then
  echo "ok       jobs table: train-demo running"
else
  echo "FAIL     jobs table: no running train-demo row" >&2
  exit 1
fi
# The dashboard's p99 (the Routers table: the router's latency histogram,
# interpolated inside its bucket as Prometheus does) beside the demo's own
# (its KServe load, every answer timed by the client). Printed, not judged:
# the buckets (5, 10, 25 ms) bound how close an interpolation can come.
dash_p99="$(python3 -c 'import re,sys; d=open(sys.argv[1]).read(); t=d[d.find("id=\"routers\""):]; c=re.findall(r"<td[^>]*>([^<]*)</td>", t[:t.find("</table>")]); print(c[7] if len(c) > 7 else "")' "$work/dom.html")"
demo_p99="$(sed -n 's/^latency ms: p50 [0-9.]*  p99 \([0-9.]*\).*/\1/p' "$work/demo.out" | head -1)"
echo "p99      dashboard ${dash_p99:-?} ms, the demo's own ${demo_p99:-?} ms$(
  awk -v a="$dash_p99" -v b="$demo_p99" 'BEGIN { if (a > 0 && b > 0) printf " (%+.1f%%)", 100 * (a - b) / b }')"
"${browser[@]}" --window-size=1280,1700 --screenshot="$png" "$url" 2>>"$work/chromium.err"
[ -s "$png" ] || { echo "dashboard-screenshot: no screenshot written" >&2; exit 1; }
echo "ok       screenshot $png"
