#!/usr/bin/env bash
# Router throughput against nginx and HAProxy as equivalent keep-alive reverse
# proxies in front of the same fast backend (nginx serving fixed bodies),
# all driven by wrk on loopback, in one run. Also wrk straight to the backend:
# the ceiling. Each proxy gets the same number of worker threads (1, then 2).
#   bench/router_throughput.sh GPUHA_BINARY [SECONDS] [CONNECTIONS]
# Prints a Markdown table for bench/RESULTS.md.
set -euo pipefail
gpuha="$(realpath "${1:?usage: router_throughput.sh GPUHA_BINARY [SECONDS] [CONNECTIONS]}")"
secs="${2:-10}"
conns="${3:-64}"
for tool in nginx haproxy wrk; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-bench.XXXXXX)"
chmod 755 "$work"  # nginx workers run as nobody
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

BACKEND=19301 NGINX=19302 HAPROXY=19303 ROUTER=19304
head -c 65536 /dev/zero | tr '\0' 'x' > "$work/64k"
small="$(head -c 100 /dev/zero | tr '\0' 's')"

cat > "$work/backend.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/backend.pid;
error_log $work/backend.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$BACKEND;
    location = /small { return 200 "$small"; }
    location = /big { alias $work/64k; }
    location / { return 200 "ok"; }
  }
}
CONF
nginx -p "$work" -c "$work/backend.conf" & pids+=($!)

start_peers() {  # $1 = worker threads
  local t="$1"
  cat > "$work/nginx.conf" <<CONF
worker_processes $t;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream be { server 127.0.0.1:$BACKEND; keepalive 256; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$NGINX;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
  cat > "$work/haproxy.cfg" <<CONF
global
  nbthread $t
  maxconn 8000
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
  http-reuse always
frontend fe
  bind 127.0.0.1:$HAPROXY
  default_backend be
backend be
  server b1 127.0.0.1:$BACKEND
CONF
  cat > "$work/router.yaml" <<CONF
listen: 127.0.0.1:$ROUTER
threads: $t
routes:
  - {stream: s1, primary: 127.0.0.1:$BACKEND}
CONF
  nginx -p "$work" -c "$work/nginx.conf" & peer_pids=($!)
  haproxy -f "$work/haproxy.cfg" -db 2>"$work/haproxy.err" & peer_pids+=($!)
  "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & peer_pids+=($!)
  sleep 1
}
stop_peers() { for p in "${peer_pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait "${peer_pids[@]}" 2>/dev/null || true; sleep 0.5; }

# wrk -> "req/s p99_ms"
measure() {
  local out
  out="$(wrk -t1 -c"$conns" -d"${secs}s" --latency "$1")"
  local rps p99
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  p99="$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")"
  if grep -q "Non-2xx" <<<"$out"; then echo "non-2xx answers from $1" >&2; exit 1; fi
  if [[ -z "$rps" ]]; then echo "wrk failed on $1: $out" >&2; exit 1; fi
  echo "$rps $p99"
}

echo "| body | threads | peer | req/s | p99 ms | vs nginx (req/s) | p99 vs nginx |"
echo "|---|---|---|---|---|---|---|"
for t in 1 2; do
  start_peers "$t"
  for body in small big; do
    label=$([[ $body == small ]] && echo "100 B" || echo "64 KiB")
    read -r d_rps d_p99 < <(measure "http://127.0.0.1:$BACKEND/$body")
    read -r n_rps n_p99 < <(measure "http://127.0.0.1:$NGINX/$body")
    read -r h_rps h_p99 < <(measure "http://127.0.0.1:$HAPROXY/$body")
    read -r g_rps g_p99 < <(measure "http://127.0.0.1:$ROUTER/streams/s1/$body")
    for row in "wrk -> backend (limit)|$d_rps|$d_p99" "nginx|$n_rps|$n_p99" "HAProxy|$h_rps|$h_p99" "gpuha router|$g_rps|$g_p99"; do
      IFS='|' read -r name rps p99 <<<"$row"
      awk -v b="$label" -v t="$t" -v n="$name" -v r="$rps" -v p="$p99" -v nr="$n_rps" -v np="$n_p99" \
        'BEGIN { printf "| %s | %d | %s | %.0f | %.2f | %.2fx | %.2fx |\n", b, t, n, r, p, r/nr, p/np }'
    done
  done
  stop_peers
done
