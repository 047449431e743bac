#!/usr/bin/env bash
# Router throughput against nginx and HAProxy as equivalent keep-alive reverse
# proxies in front of the same fast backend (nginx serving fixed bodies),
# all driven by wrk on loopback, in one run. Also wrk straight to the backend:
# the ceiling. Each proxy gets the same number of worker threads (1, then 2).
#   bench/router_throughput.sh GPUHA_BINARY [SECONDS] [CONNECTIONS] [ROUNDS]
# SECONDS is the length of one wrk run; each cell takes ROUNDS runs per peer.
# Prints a Markdown table for bench/RESULTS.md.
set -euo pipefail
gpuha="$(realpath "${1:?usage: router_throughput.sh GPUHA_BINARY [SECONDS] [CONNECTIONS] [ROUNDS]}")"
secs="${2:-5}"
conns="${3:-64}"
rounds="${4:-5}"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
for tool in nginx haproxy wrk; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-bench.XXXXXX)"
chmod 755 "$work"  # nginx workers run as nobody
pids=()
peer_pids=()
cleanup() {
  for p in "${pids[@]}" "${peer_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

BACKEND=19301 NGINX=19302 HAPROXY=19303 ROUTER=19304
head -c 65536 /dev/zero | tr '\0' 'x' > "$work/64k"
small="$(head -c 100 /dev/zero | tr '\0' 's')"

cat > "$work/backend.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/backend.pid;
error_log $work/backend.err notice;
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
admin: 127.0.0.1:0
threads: $t
auth: none
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

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# Each cell is measured in `rounds` rounds; within a round the four targets
# run one after the other, so a noisy moment on this shared machine lands on
# one round of every peer rather than on all of one peer's. The table gives
# the medians; the last column is the router's ratio to nginx round by round.
echo "| body | threads | peer | req/s (median of $rounds) | p99 ms (median) | vs nginx (req/s) | p99 vs nginx | router/nginx by round |"
echo "|---|---|---|---|---|---|---|---|"
for t in 1 2; do
  start_peers "$t"
  for body in small big; do
    label=$([[ $body == small ]] && echo "100 B" || echo "64 KiB")
    declare -A rps=() p99=() last=()
    by_round=""
    for ((r = 1; r <= rounds; r++)); do
      for name in backend nginx haproxy router; do
        case "$name" in
          backend) url="http://127.0.0.1:$BACKEND/$body" ;;
          nginx) url="http://127.0.0.1:$NGINX/$body" ;;
          haproxy) url="http://127.0.0.1:$HAPROXY/$body" ;;
          router) url="http://127.0.0.1:$ROUTER/streams/s1/$body" ;;
        esac
        read -r x y < <(measure "$url")
        rps[$name]+="$x "
        p99[$name]+="$y "
        last[$name]="$x"
      done
      by_round+="$(awk -v a="${last[router]}" -v b="${last[nginx]}" 'BEGIN {printf "%.2f ", a/b}')"
    done
    n_rps="$(median <<<"${rps[nginx]}")"
    n_p99="$(median <<<"${p99[nginx]}")"
    for row in "wrk -> backend (limit)|backend" "nginx|nginx" "HAProxy|haproxy" "gpuha router|router"; do
      IFS='|' read -r title name <<<"$row"
      r_med="$(median <<<"${rps[$name]}")"
      p_med="$(median <<<"${p99[$name]}")"
      extra=$([[ $name == router ]] && echo "$by_round" || echo "")
      awk -v b="$label" -v t="$t" -v n="$title" -v r="$r_med" -v p="$p_med" -v nr="$n_rps" \
        -v np="$n_p99" -v x="$extra" \
        'BEGIN { printf "| %s | %d | %s | %.0f | %.2f | %.2fx | %.2fx | %s |\n", b, t, n, r, p, r/nr, p/np, x }'
    done
  done
  stop_peers
done
