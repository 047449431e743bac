#!/usr/bin/env bash
# Restarts under load, the router against nginx and HAProxy in one run: each
# proxy in front of the same backend (nginx serving a fixed body), open-loop
# HTTP/1.1 over 32 keep-alive connections from a client that never retries
# (`gpuha load --no-resend`), restarted twice while the load runs:
#   gpuha   a new process through the handoff socket (the old one drains)
#   nginx   `nginx -s reload` (new workers; the old ones finish and close)
#   haproxy master-worker reload (USR2) with `expose-fd listeners`: the
#           seamless reload, listeners passed to the new worker
#   bench/router_restart.sh GPUHA_BINARY [RATE] [SECONDS]
# Prints a Markdown table for bench/RESULTS.md: failed, refused (connect
# errors), the longest gap between answers, per proxy. Then the router alone
# (its peers here serve HTTP/1.1 only) in front of `gpuha worker`, through
# the same two restarts: gRPC unary calls, ModelStreamInfer streams, and 50
# streamed completions (SSE) open at all times, every answer checked whole.
set -euo pipefail
gpuha="$(realpath "${1:?usage: router_restart.sh GPUHA_BINARY [RATE] [SECONDS]}")"
rate="${2:-1000}"
secs="${3:-6}"
for tool in nginx haproxy python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-restart.XXXXXX)"
chmod 755 "$work"  # nginx workers run as nobody
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pkill -f "$work/" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

BACKEND=19401 NGINX=19402 HAPROXY=19403 ROUTER=19404 WORKER=19405 WORKER_GRPC=19406
# shellcheck source=bench/lib/procs.sh
source "$(dirname "$0")/lib/procs.sh"
require_free_ports $BACKEND $NGINX $HAPROXY $ROUTER $WORKER $WORKER_GRPC

# nginx_conf NAME PORT LOCATION: an nginx of one worker on PORT, its pid
# and log under $work, with one `location /` body.
nginx_conf() {
  cat > "$work/$1.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/$1.pid;
error_log $work/$1.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream be { server 127.0.0.1:$BACKEND; keepalive 64; }
  server { listen 127.0.0.1:$2; location / { $3 } }
}
CONF
}
nginx_conf backend "$BACKEND" 'return 200 "ok";'
nginx -p "$work" -c "$work/backend.conf" & pids+=($!)
nginx_conf nginx "$NGINX" 'proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection "";'
cat > "$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 8000
  stats socket $work/haproxy.sock mode 600 level admin expose-fd listeners
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$HAPROXY
  default_backend be
backend be
  server b1 127.0.0.1:$BACKEND
CONF
cat > "$work/router.yaml" <<CONF
listen: 127.0.0.1:$ROUTER
admin: 127.0.0.1:0
threads: 1
tenants:
  - { name: bench, api_keys_sha256: ["$("$gpuha" ctl hash-token bench-key)"], default_stream: s1,
      requests_per_second: 1000000, burst: 1000000, max_concurrent: 100000 }
routes:
  - { stream: s1, tenant: bench, primary: "127.0.0.1:$BACKEND" }
CONF

start() {
  case "$1" in
    nginx) nginx -p "$work" -c "$work/nginx.conf" & pids+=($!) ;;
    haproxy) haproxy -W -f "$work/haproxy.cfg" -p "$work/haproxy.pid" 2>"$work/haproxy.err" & pids+=($!) ;;
    gpuha) "$gpuha" router --config "$work/router.yaml" --handoff-socket "$work/router.sock" \
             >/dev/null 2>>"$work/router.err" & pids+=($!) ;;
  esac
  sleep 1
}
restart() {
  case "$1" in
    nginx) nginx -p "$work" -c "$work/nginx.conf" -s reload 2>/dev/null ;;
    haproxy) kill -USR2 "$(head -1 "$work/haproxy.pid")" ;;
    gpuha) "$gpuha" router --config "$work/router.yaml" --handoff-socket "$work/router.sock" \
             >/dev/null 2>>"$work/router.err" & pids+=($!) ;;
  esac
}
stop() {
  case "$1" in
    nginx) nginx -p "$work" -c "$work/nginx.conf" -s stop 2>/dev/null ;;
    haproxy) kill "$(head -1 "$work/haproxy.pid")" ;;
    gpuha) pkill -TERM -f -- "--handoff-socket $work/router.sock" ;;
  esac
  sleep 1
}

echo "| proxy | restart | sent | failed | refused | longest gap ms | failures |"
echo "|---|---|---|---|---|---|---|"
for name in nginx haproxy gpuha; do
  case "$name" in
    nginx) port=$NGINX how="nginx -s reload" ;;
    haproxy) port=$HAPROXY how="master-worker reload, expose-fd listeners" ;;
    gpuha) port=$ROUTER how="new process through the handoff socket" ;;
  esac
  start "$name"
  "$gpuha" load --target "127.0.0.1:$port" --direct --path /x --key bench-key --streams 32 \
    --rate "$rate" --seconds "$secs" --timeout 5 --no-resend --quiet --json "$work/$name.json" \
    >/dev/null || true &
  load=$!
  third=$(python3 -c "print($secs / 3)")
  sleep "$third"; restart "$name"
  sleep "$third"; restart "$name"
  wait "$load" || true
  stop "$name"
  python3 - "$work/$name.json" "$name" "$how" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
refused = sum(n for why, n in r["failures"].items() if why.startswith("connect"))
why = ", ".join("%s: %d" % kv for kv in sorted(r["failures"].items())) or "-"
print("| %s | %s | %d | %d | %d | %.1f | %s |" % (sys.argv[2], sys.argv[3], r["sent"], r["failed"],
      refused, r["max_gap_ms"], why))
PY
done

# The router alone: HTTP/2 (gRPC) and SSE through two restarts.
"$gpuha" worker --listen "127.0.0.1:$WORKER" --grpc-listen "127.0.0.1:$WORKER_GRPC" --node w1 \
  --latency 1 --ttft 20 --token-latency 10 --capacity 100000 >/dev/null 2>"$work/worker.err" &
pids+=($!)
{
  sed -n '1,/^routes:/p' "$work/router.yaml"
  for i in $(seq 0 49); do
    echo "  - { stream: cam-$i, tenant: bench, primary: \"127.0.0.1:$WORKER\", primary_grpc: \"127.0.0.1:$WORKER_GRPC\" }"
  done
} > "$work/router2.yaml"
mv "$work/router2.yaml" "$work/router.yaml"
start gpuha
load() {  # NAME, then gpuha load flags
  local name="$1"
  shift
  "$gpuha" load --target "127.0.0.1:$ROUTER" --key bench-key --seconds "$secs" --timeout 10 \
    --no-resend --quiet --json "$work/h2-$name.json" "$@" >/dev/null || true
}
load sse --protocol sse --rate 0 --concurrency 50 --streams 50 --max-tokens 64 &
sse=$!
load grpc --protocol grpc --rate 200 --streams 4 &
grpc=$!
load grpc-stream --protocol grpc-stream --rate 200 --streams 4 &
grpc_stream=$!
sleep "$third"; restart gpuha
sleep "$third"; restart gpuha
wait "$sse" "$grpc" "$grpc_stream" || true
echo
echo "| gpuha, through the same two restarts | sent | answered whole | failed | re-sent after a drain | failures |"
echo "|---|---|---|---|---|---|"
for name in sse grpc grpc-stream; do
  python3 - "$work/h2-$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
what = {"sse": "SSE completions, 50 open at all times", "grpc": "gRPC unary ModelInfer, 200/s",
        "grpc-stream": "gRPC ModelStreamInfer messages, 200/s on 4 streams"}[sys.argv[2]]
why = ", ".join("%s: %d" % kv for kv in sorted(r["failures"].items())) or "-"
print("| %s | %d | %d | %d | %d | %s |" % (what, r["sent"], r["ok"], r["failed"],
      r["stale_retries"], why))
PY
done
