#!/usr/bin/env bash
# KServe REST over HTTP/2 (h2c) to an HTTP/1.1 upstream, the router against
# HAProxy (`bind ... proto h2`, an HTTP/1.1 server) and nginx (`listen ...
# http2`, proxy_pass) in front of the same `gpuha worker`, driven by h2load
# with the same KServe v2 infer call (JSON, POST), in one run, one worker
# thread each. Every cell also checks the worker counted each call a success.
#   bench/h2_rest_throughput.sh GPUHA_BINARY [CALLS] [CONNECTIONS] [STREAMS] [ROUNDS]
# Prints a Markdown table for bench/RESULTS.md: calls/s per round.
set -euo pipefail
gpuha="$(realpath "${1:?usage: h2_rest_throughput.sh GPUHA_BINARY [CALLS] [CONNECTIONS] [STREAMS] [ROUNDS]}")"
calls="${2:-20000}" conns="${3:-16}" streams="${4:-8}" rounds="${5:-3}"
for tool in nginx haproxy h2load curl; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d /tmp/gpuha-h2rest.XXXXXX)"
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=bench/lib/procs.sh
source "$here/lib/procs.sh"
WORKER=19411 NGINX=19412 HAPROXY=19413 ROUTER=19414
require_free_ports $WORKER $NGINX $HAPROXY $ROUTER

printf '%s' '{"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,1,3],"data":[1,2,3]}]}' \
  > "$work/infer.json"
"$gpuha" worker --listen 127.0.0.1:$WORKER --latency 0 --threads 2 --capacity 100000 --node w \
  >/dev/null 2>"$work/worker.err" & pids+=($!)
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream be { server 127.0.0.1:$WORKER; keepalive 64; }
  server {
    listen 127.0.0.1:$NGINX http2;
    http2_max_concurrent_streams 1024;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
cat > "$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend fe
  bind 127.0.0.1:$HAPROXY proto h2
  default_backend be
backend be
  server w1 127.0.0.1:$WORKER
CONF
cat > "$work/router.yaml" <<CONF
listen: 127.0.0.1:$ROUTER
admin: 127.0.0.1:0
threads: 1
auth: none
limits: {h2_max_concurrent_streams: 1024}
routes:
  - {stream: s1, primary: 127.0.0.1:$WORKER}
CONF
nginx -p "$work" -c "$work/nginx.conf" & pids+=($!)
haproxy -f "$work/haproxy.cfg" -db 2>"$work/haproxy.err" & pids+=($!)
"$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & pids+=($!)
sleep 1

successes() {
  curl -s "http://127.0.0.1:$WORKER/metrics" |
    awk '$1 ~ /^nv_inference_request_success[{ ]/ {s += $2} END {print s + 0}'
}
measure() {  # URL -> calls/s; fails unless every call was a 200 and a success upstream
  local url="$1" before out after
  before="$(successes)"
  out="$(h2load -n "$calls" -c "$conns" -m "$streams" -d "$work/infer.json" \
    -H 'content-type: application/json' "$url" 2>&1)"
  after="$(successes)"
  grep -q "status codes: $calls 2xx" <<<"$out" || { echo "not all 2xx: $out" >&2; exit 1; }
  (( after - before == calls )) || { echo "worker counted $((after - before)) of $calls" >&2; exit 1; }
  sed -n 's/.*finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out" | cut -d. -f1
}
echo "| round | gpuha router | HAProxy (h2 -> h1) | nginx (http2 -> h1) | gpuha / HAProxy | gpuha / nginx |"
echo "|---:|---:|---:|---:|---:|---:|"
for r in $(seq "$rounds"); do
  g=$(measure "http://127.0.0.1:$ROUTER/streams/s1/v2/models/cv/infer")
  h=$(measure "http://127.0.0.1:$HAPROXY/v2/models/cv/infer")
  n=$(measure "http://127.0.0.1:$NGINX/v2/models/cv/infer")
  echo "| $r | $g | $h | $n | $(awk -v a="$g" -v b="$h" 'BEGIN{printf "%.2f", a/b}') | $(awk -v a="$g" -v b="$n" 'BEGIN{printf "%.2f", a/b}') |"
done
