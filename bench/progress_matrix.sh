#!/usr/bin/env bash
# The half-hang (health 200, inference stuck) at every load, on two backends
# that were not written together (issue 37): gpuha's router beside nginx with
# a 2 s read timeout, in the same run, cell by cell.
#
# Streams s-0..s-{N-1} all have primary A and standby C. Open-loop load of
# RATE req/s in all over N streams (gpuha load, a connection per request in
# flight, kept alive); a share SLOW of requests is legitimately slow (1.5 s,
# ?delay_ms=1500). FAULT_AT seconds in, A half-hangs (SIGUSR1: its health
# path keeps answering 200, no inference request is answered again).
# Backends: "cpp" is gpuha-test-backend, "py" is bench/backends/asyncio_backend.py
# (Python asyncio, one process, no code shared with gpuha, idle keep-alive
# connections closed after 5 s as uvicorn does).
#
#   bench/progress_matrix.sh GPUHA_BINARY TEST_BACKEND [SECONDS]
# Cells (each a list in the environment): BACKENDS="cpp py" RATES="200 500
# 1000 2000" STREAMS="1 20 200" THREADS="1 2" SLOW="0 0.02"; PEERS="gpuha
# nginx". Prints one Markdown row per cell and peer; exits 1 if a gpuha
# cell lost or failed a request, cut a slow one, or stalled past GAP_MS (250).
set -euo pipefail
source "$(dirname "$0")/lib/procs.sh"
gpuha="$(realpath "${1:?usage: progress_matrix.sh GPUHA_BINARY TEST_BACKEND [SECONDS]}")"
cpp_backend="$(realpath "${2:?test backend binary}")"
py_backend="$(dirname "$(realpath "$0")")/backends/asyncio_backend.py"
secs="${3:-6}"
fault_at="${FAULT_AT:-2}"
gap_ms="${GAP_MS:-250}"
backends="${BACKENDS:-cpp py}"
rates="${RATES:-200 500 1000 2000}"
stream_counts="${STREAMS:-1 20 200}"
thread_counts="${THREADS:-1 2}"
slow_shares="${SLOW:-0 0.02}"
peers="${PEERS:-gpuha nginx}"
command -v nginx >/dev/null || { echo "missing nginx: run scripts/install-deps.sh" >&2; exit 2; }
command -v python3 >/dev/null || { echo "missing python3: run scripts/install-deps.sh" >&2; exit 2; }

work="$(mktemp -d /tmp/gpuha-matrix.XXXXXX)"
pids=()
cleanup() { stop_procs "${pids[@]}"; if [[ -n "${KEEP:-}" ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi; }
trap cleanup EXIT
A=19501 C=19503 PROXY=19510

# Waits until 127.0.0.1:$1 answers $2 with 200 (at most 10 s).
wait_ready() {
  for _ in $(seq 200); do
    curl -fs -o /dev/null "http://127.0.0.1:$1$2" && return 0
    sleep 0.05
  done
  echo "127.0.0.1:$1 never answered $2" >&2
  return 1
}

start_backends() {  # $1 = cpp|py
  backend_pids=()
  local p
  for p in $A $C; do
    if [[ $1 == cpp ]]; then
      "$cpp_backend" --name "$p" --port "$p" --threads 1 >/dev/null &
    else
      python3 "$py_backend" --name "$p" --port "$p" >/dev/null &
    fi
    backend_pids+=($!); pids+=($!)
  done
  wait_ready $A /v2/health/ready
  wait_ready $C /v2/health/ready
}

start_gpuha() {  # $1 = streams, $2 = threads
  {
    echo "listen: 127.0.0.1:$PROXY"
    echo "admin: 127.0.0.1:0"
    echo "threads: $2"
    echo "auth: none"
    echo "routes:"
    for i in $(seq 0 $(($1 - 1))); do
      echo "  - {stream: s-$i, primary: 127.0.0.1:$A, standby: 127.0.0.1:$C}"
    done
  } > "$work/router.yaml"
  "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" &
  proxy_pid=$!; pids+=($!)
}

# nginx with a 2 s read timeout, just above the slow tail: the setting an
# operator who knows the tail would choose (the issue's peer).
start_nginx() {  # $1 = streams, $2 = workers
  cat > "$work/nginx.conf" <<CONF
worker_processes $2;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  upstream up { server 127.0.0.1:$A max_fails=1 fail_timeout=1s; server 127.0.0.1:$C backup max_fails=0; keepalive 64; }
  server {
    listen 127.0.0.1:$PROXY;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_read_timeout 2s; proxy_connect_timeout 100ms;
    proxy_next_upstream error timeout http_502 http_503; proxy_next_upstream_tries 2;
    location /streams/ { proxy_pass http://up; }
    location /v2/health/ { proxy_pass http://up; }
  }
}
CONF
  nginx -p "$work" -c "$work/nginx.conf" & proxy_pid=$!; pids+=($!)
}

stop_all() { stop_procs "$proxy_pid" "${backend_pids[@]}"; }

bad=0
run_cell() {  # $1 backend, $2 rate, $3 streams, $4 threads, $5 slow share, $6 peer
  rm -f "$work/out.json"
  require_free_ports $A $C $PROXY
  start_backends "$1"
  if [[ $6 == gpuha ]]; then start_gpuha "$3" "$4"; else start_nginx "$3" "$4"; fi
  wait_ready $PROXY /streams/s-0/v2/health/ready
  "$gpuha" load --target 127.0.0.1:$PROXY --stream-prefix s- --streams "$3" --rate "$2" \
    --seconds "$secs" --timeout 5 --slow-fraction "$5" --slow-query delay_ms=1500 --quiet \
    --json "$work/out.json" >"$work/load.out" 2>&1 &
  local load=$!
  sleep "$fault_at"
  kill -USR1 "${backend_pids[0]}"
  wait "$load" || true
  [[ -s "$work/out.json" ]] || { echo "load produced no report ($*)" >&2; cat "$work/load.out" >&2; exit 1; }
  local verdicts=""
  if [[ $6 == gpuha ]]; then
    verdicts="$(grep -c "is stalled" "$work/router.err" || true)"
  fi
  python3 - "$@" "$work/out.json" "$gap_ms" "$verdicts" <<'PY' || bad=1
import json, sys
backend, rate, streams, threads, slow, peer, path, gap_ms, verdicts = sys.argv[1:]
r = json.load(open(path))
cut = r["slow_sent"] - r["slow_ok"]
lost = r["sent"] - r["ok"] - r["failed"]
fails = ", ".join(f"{k} {v}" for k, v in r["failures"].items()) or "-"
print(f"| {backend} | {rate} | {streams} | {threads} | {float(slow) * 100:.0f}% | {peer} | {r['sent']} "
      f"| {lost} | {r['failed']} | {cut} of {r['slow_sent']} | {r['max_stall_ms']:.1f} "
      f"| {r['max_gap_ms']:.1f} | {r['stale_retries']} | {verdicts or '-'} | {fails} |", flush=True)
ok = lost == 0 and r["failed"] == 0 and cut == 0 and r["max_stall_ms"] < float(gap_ms)
sys.exit(0 if peer != "gpuha" or ok else 1)
PY
  stop_all
}

echo "| backend | req/s | streams | router threads | slow | peer | sent | lost | failed | slow cut | longest stall ms | longest gap ms | stale retries | stall verdicts | failures |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for backend in $backends; do
  for rate in $rates; do
    for n in $stream_counts; do
      for threads in $thread_counts; do
        for slow in $slow_shares; do
          for peer in $peers; do
            run_cell "$backend" "$rate" "$n" "$threads" "$slow" "$peer"
          done
        done
      done
    done
  done
done
exit $bad
