#!/usr/bin/env bash
# Failover under open-loop load, gpuha router against nginx and HAProxy with a
# backup server (each at its defaults and tuned), in one run.
#
# 20 streams at RATE req/s in all; cam-0..9 have primary A, cam-10..19 primary
# B, all have standby C (upstreams are gpuha-test-backend processes). 2% of
# requests take 1.5 s on a healthy backend. FAULT_AT seconds in, A gets
# kill -9 (crash), SIGSTOP (hang) or SIGUSR1 (half-hang: its health check
# keeps answering 200 while no other request is answered, the deadlocked
# engine). Each peer and fault gets fresh upstreams. FAULTS picks the faults.
# PROTOCOL=h2: HTTP/2 clients instead (h2load over h2c, closed loop, 8
# connections x 4 streams over the 20 streams' URLs, no slow requests), the
# proxies taking HTTP/2 and speaking HTTP/1.1 upstream; h2load counts
# answers, not gaps.
#   bench/router_failover.sh GPUHA_BINARY TEST_BACKEND [SECONDS] [RATE]
set -euo pipefail
source "$(dirname "$0")/lib/procs.sh"
source "$(dirname "$0")/lib/static_router.sh"
gpuha="$(realpath "${1:?usage: router_failover.sh GPUHA_BINARY TEST_BACKEND [SECONDS] [RATE]}")"
backend="$(realpath "${2:?test backend binary}")"
secs="${3:-12}"
rate="${4:-1000}"
fault_at="${FAULT_AT:-4}"
faults="${FAULTS:-crash hang half-hang}"
protocol="${PROTOCOL:-http1}"
listen_opt="" haproxy_bind=""
nginx_h2=""
if [[ $protocol == h2 ]]; then
  listen_opt=" http2" haproxy_bind=" proto h2"
  # nginx ends an HTTP/2 connection after 1000 requests by default, which
  # h2load counts as failures of their own.
  nginx_h2="keepalive_requests 1000000;"
fi
for tool in nginx haproxy; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-failover.XXXXXX)"
pids=()
cleanup() { stop_procs "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
A=19401 B=19402 C=19403 PROXY=19410

start_backends() {
  backend_pids=()
  for p in $A $B $C; do
    "$backend" --name "$p" --port "$p" --threads 1 >/dev/null & backend_pids+=($!); pids+=($!)
  done
  sleep 0.3
}
stop_all() {
  # The proxy gets SIGTERM: nginx's master then takes its workers with it.
  [[ -n "${proxy_pid:-}" ]] && kill -TERM "$proxy_pid" 2>/dev/null || true
  for p in "${backend_pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  wait "${backend_pids[@]}" "$proxy_pid" 2>/dev/null || true
  sleep 0.3
}

# The tuned peers time out at 500 ms, so they cut every 1.5 s slow request by
# construction; "fair" sets the read timeout just above the slow tail (2 s),
# the setting an operator who knows the tail would choose. All three run.
nginx_conf() {  # $1 = default|tuned|fair
  local extra="" server_opts="" backup_opts=""
  if [[ $1 == tuned || $1 == fair ]]; then
    local read_timeout=500ms
    [[ $1 == fair ]] && read_timeout=2s
    extra="proxy_read_timeout $read_timeout; proxy_connect_timeout 100ms; proxy_next_upstream error timeout http_502 http_503; proxy_next_upstream_tries 2;"
    server_opts="max_fails=1 fail_timeout=1s"
    backup_opts="max_fails=0"  # else slow requests cut on the backup take it out too
  fi
  cat > "$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  $nginx_h2
  upstream ga { server 127.0.0.1:$A $server_opts; server 127.0.0.1:$C backup $backup_opts; keepalive 64; }
  upstream gb { server 127.0.0.1:$B $server_opts; server 127.0.0.1:$C backup $backup_opts; keepalive 64; }
  server {
    listen 127.0.0.1:$PROXY$listen_opt;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    $extra
    location ~ ^/streams/cam-1[0-9]/ { proxy_pass http://gb; }
    location ~ ^/streams/cam-[0-9]/ { proxy_pass http://ga; }
  }
}
CONF
  nginx -p "$work" -c "$work/nginx.conf" & proxy_pid=$!; pids+=($!)
}

haproxy_conf() {  # $1 = default|tuned|fair
  local check="check inter 2s fall 3" timeouts="timeout server 30s" retry="retries 3"
  if [[ $1 == tuned || $1 == fair ]]; then
    check="check inter 100ms fall 2"
    timeouts="timeout server 500ms"
    [[ $1 == fair ]] && timeouts="timeout server 2s"
    retry="retries 3
  retry-on all-retryable-errors"
  fi
  cat > "$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  $timeouts
  option http-keep-alive
  option redispatch
  $retry
frontend fe
  bind 127.0.0.1:$PROXY$haproxy_bind
  acl gb path_reg ^/streams/cam-1[0-9]/
  use_backend gb if gb
  default_backend ga
backend ga
  option httpchk GET /v2/health/ready
  server a 127.0.0.1:$A $check
  server c 127.0.0.1:$C $check backup
backend gb
  option httpchk GET /v2/health/ready
  server b 127.0.0.1:$B $check
  server c 127.0.0.1:$C $check backup
CONF
  haproxy -f "$work/haproxy.cfg" -db 2>"$work/haproxy.err" & proxy_pid=$!; pids+=($!)
}

router_conf() {
  static_router_yaml "$work/router.yaml" $PROXY $A $B $C
  "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & proxy_pid=$!; pids+=($!)
}

run_one() {  # $1 = peer label, $2 = setup command, $3 = crash|hang|half-hang
  rm -f "$work/out.json"
  require_free_ports $A $B $C $PROXY
  start_backends
  $2
  sleep 1
  if [[ $protocol == h2 ]]; then
    local urls=()
    for i in $(seq 0 19); do urls+=("http://127.0.0.1:$PROXY/streams/cam-$i/v2/models/m/infer"); done
    h2load -D "$secs" -c 8 -m 4 -T 5 "${urls[@]}" >"$work/load.out" 2>&1 &
  else
    "$gpuha" load --target 127.0.0.1:$PROXY --streams 20 --rate "$rate" --seconds "$secs" \
      --timeout 5 --slow-fraction 0.02 --slow-query delay_ms=1500 --quiet \
      --json "$work/out.json" >"$work/load.out" 2>&1 &
  fi
  local load=$!
  sleep "$fault_at"
  case $3 in
    crash) kill -9 "${backend_pids[0]}" ;;
    hang) kill -STOP "${backend_pids[0]}" ;;
    half-hang) kill -USR1 "${backend_pids[0]}" ;;
  esac
  wait "$load" || true
  if [[ $protocol == h2 ]]; then
    python3 - "$1" "$3" "$work/load.out" <<'PY'
import re, sys
peer, fault, path = sys.argv[1:]
out = open(path).read()
m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
              r"(\d+) errored, (\d+) timeout", out)
c = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
if not m or not c:
    sys.exit(f"h2load gave no counts for {peer} / {fault}:\n{out[-800:]}")
total, started, done, ok, failed, errored, timeout = map(int, m.groups())
# h2load's failed holds its errored and timed-out; a 4xx or 5xx is a done
# request that failed too. Requests still open when -D ended are neither.
not2xx = int(c.group(3)) + int(c.group(4))
print(f"| {peer} | {fault} | {done} | {failed + not2xx} | - | - | - | - | "
      f"h2load: failed {failed} (errored {errored}, timeout {timeout}), 4xx/5xx {not2xx} |")
PY
    stop_all
    return
  fi
  [[ -s "$work/out.json" ]] || { echo "load produced no report for $1 / $3" >&2; exit 1; }
  python3 - "$1" "$3" "$work/out.json" <<'PY'
import json, sys
peer, fault, path = sys.argv[1:]
r = json.load(open(path))
fails = ", ".join(f"{k} {v}" for k, v in r["failures"].items()) or "-"
print(f"| {peer} | {fault} | {r['sent']} | {r['failed']} | {r['max_gap_ms']:.1f} | {r['max_stall_ms']:.1f} | "
      f"{r['slow_sent'] - r['slow_ok']} of {r['slow_sent']} | {r['latency_ms']['p99']:.1f} | {fails} |")
PY
  stop_all
}

echo "| peer | fault | sent | failed | longest gap ms | longest stall ms | slow requests failed | p99 ms | failures |"
echo "|---|---|---|---|---|---|---|---|---|"
for fault in $faults; do
  run_one "gpuha router" router_conf "$fault"
  run_one "nginx (backup, defaults)" "nginx_conf default" "$fault"
  run_one "nginx (tuned: read 500ms, next_upstream timeout)" "nginx_conf tuned" "$fault"
  run_one "nginx (fair: read 2s, just above the slow tail)" "nginx_conf fair" "$fault"
  run_one "HAProxy (inter 2s fall 3, redispatch, retries 3)" "haproxy_conf default" "$fault"
  run_one "HAProxy (tuned: inter 100ms fall 2, server 500ms, retry-on)" "haproxy_conf tuned" "$fault"
  run_one "HAProxy (fair: inter 100ms fall 2, server 2s, retry-on)" "haproxy_conf fair" "$fault"
done
