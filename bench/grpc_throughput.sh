#!/usr/bin/env bash
# gRPC unary throughput through the router, against nginx (grpc_pass) and
# HAProxy (h2 on both sides) in front of the same upstream, a `gpuha worker`
# serving KServe v2 gRPC, all driven by h2load (nghttp2-client) with the same
# ModelInfer call, in one run; also h2load straight to the worker (the
# ceiling). Each proxy gets the same number of worker threads (1, then 2).
# h2load counts HTTP status only, so every cell also checks the worker's
# nv_inference_request_failure stayed 0 and its successes grew by every call.
#   bench/grpc_throughput.sh GPUHA_BINARY [CALLS] [CONNECTIONS] [STREAMS] [ROUNDS]
# Prints a Markdown table for bench/RESULTS.md: calls/s, and p99 from
# h2load's per-call log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gpuha="$(realpath "${1:?usage: grpc_throughput.sh GPUHA_BINARY [CALLS] [CONNECTIONS] [STREAMS] [ROUNDS]}")"
calls="${2:-20000}"
conns="${3:-16}"
streams="${4:-8}"
rounds="${5:-3}"
for v in calls conns streams rounds; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "${v^^} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for tool in nginx haproxy h2load python3 curl; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-grpc-bench.XXXXXX)"
chmod 755 "$work"
pids=()
peer_pids=()
cleanup() {
  for p in "${pids[@]}" "${peer_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

WORKER_HTTP=19401 WORKER=19402 NGINX=19403 HAPROXY=19404 ROUTER=19405

# One ModelInfer call, gRPC-framed: an 8x8 RGB frame as raw contents.
python3 "$here/lib/model_infer_call.py" "$work/call.bin"

"$gpuha" worker --listen 127.0.0.1:$WORKER_HTTP --grpc-listen 127.0.0.1:$WORKER --latency 0 \
  --threads 2 --capacity 100000 --node w >/dev/null 2>"$work/worker.err" & pids+=($!)

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
  keepalive_requests 1000000;  # nginx ends an HTTP/2 connection after 1000 calls by default
  upstream be { server 127.0.0.1:$WORKER; keepalive 64; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$NGINX http2;
    http2_max_concurrent_streams 1024;
    location / { grpc_pass grpc://be; }
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
  http-reuse always
frontend fe
  bind 127.0.0.1:$HAPROXY proto h2
  default_backend be
backend be
  server w1 127.0.0.1:$WORKER proto h2
CONF
  cat > "$work/router.yaml" <<CONF
listen: 127.0.0.1:$ROUTER
admin: 127.0.0.1:0
threads: $t
auth: none
limits: {h2_max_concurrent_streams: 1024}
routes:
  - {stream: s1, primary: 127.0.0.1:$WORKER_HTTP, primary_grpc: 127.0.0.1:$WORKER}
CONF
  nginx -p "$work" -c "$work/nginx.conf" & peer_pids=($!)
  haproxy -f "$work/haproxy.cfg" -db 2>"$work/haproxy.err" & peer_pids+=($!)
  "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & peer_pids+=($!)
  sleep 1
}
stop_peers() { for p in "${peer_pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait "${peer_pids[@]}" 2>/dev/null || true; sleep 0.5; }

counter() {  # the worker's counter $1
  curl -s "http://127.0.0.1:$WORKER_HTTP/metrics" | awk -v f="$1" '$1 ~ "^"f"[{ ]" || $1 == f {s += $2} END {print s + 0}'
}

# h2load -> "calls/s p99_ms"; fails unless every call was answered 200 and
# the worker counted each as a success.
measure() {
  local port="$1" out ok0 bad0 ok1 bad1
  ok0="$(counter nv_inference_request_success)"
  bad0="$(counter nv_inference_request_failure)"
  out="$(h2load -n "$calls" -c "$conns" -m "$streams" -d "$work/call.bin" \
    -H 'content-type: application/grpc' -H 'te: trailers' -H 'x-gpuha-stream: s1' \
    --log-file="$work/h2load.log" \
    "http://127.0.0.1:$port/inference.GRPCInferenceService/ModelInfer")"
  ok1="$(counter nv_inference_request_success)"
  bad1="$(counter nv_inference_request_failure)"
  local done rps
  done="$(awk '/^status codes:/ {print $3}' <<<"$out")"
  rps="$(awk '/^finished in/ {print $4}' <<<"$out")"
  if [[ "$done" != "$calls" || $((ok1 - ok0)) -ne "$calls" || "$bad1" != "$bad0" ]]; then
    echo "port $port: $done of $calls answered 2xx; worker successes +$((ok1 - ok0)), failures +$((bad1 - bad0))" >&2
    echo "$out" >&2
    exit 1
  fi
  # h2load's log: start (us), status, duration (us) per call.
  local p99
  p99="$(awk '{print $3}' "$work/h2load.log" | sort -n | awk '{v[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; printf "%.2f", v[i]/1000}')"
  echo "$rps $p99"
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

echo "| threads | peer | calls/s (median of $rounds) | p99 ms (median) | vs nginx (calls/s) | p99 vs nginx | router/nginx by round |"
echo "|---|---|---|---|---|---|---|"
for t in 1 2; do
  start_peers "$t"
  declare -A rps=() p99=() last=()
  by_round=""
  for ((r = 1; r <= rounds; r++)); do
    for name in worker nginx haproxy router; do
      case "$name" in
        worker) port=$WORKER ;;
        nginx) port=$NGINX ;;
        haproxy) port=$HAPROXY ;;
        router) port=$ROUTER ;;
      esac
      read -r x y < <(measure "$port")
      rps[$name]+="$x "
      p99[$name]+="$y "
      last[$name]="$x"
    done
    by_round+="$(awk -v a="${last[router]}" -v b="${last[nginx]}" 'BEGIN {printf "%.2f ", a/b}')"
  done
  n_rps="$(median <<<"${rps[nginx]}")"
  n_p99="$(median <<<"${p99[nginx]}")"
  for row in "h2load -> worker (limit)|worker" "nginx grpc_pass|nginx" "HAProxy h2|haproxy" "gpuha router|router"; do
    IFS='|' read -r title name <<<"$row"
    r_med="$(median <<<"${rps[$name]}")"
    p_med="$(median <<<"${p99[$name]}")"
    extra=$([[ $name == router ]] && echo "$by_round" || echo "")
    awk -v t="$t" -v n="$title" -v r="$r_med" -v p="$p_med" -v nr="$n_rps" -v np="$n_p99" -v x="$extra" \
      'BEGIN {printf "| %s | %s | %.0f | %.2f | %.2fx | %.2fx | %s |\n", t, n, r, p, r/nr, (np > 0 ? p/np : 0), x}'
  done
  stop_peers
done
