#!/usr/bin/env bash
# LLM token streams through a failure of the primary mid-answer: the gpuha
# router (continuation on the standby) against nginx and HAProxy with a
# backup server, in one run; then the cost of relaying SSE through the
# router against a direct connection.
#
# Two `gpuha worker` processes serve the language model: A (primary of every
# stream) and C (standby, the peers' backup). `gpuha load --protocol sse`
# keeps CONC streamed completions open (closed loop, one stream each,
# max_tokens 64 at 50 ms to first token and 20 ms a token: about 1.3 s an
# answer) and checks every answer against the model run locally. FAULT_AT
# seconds in, A gets kill -9 (crash), SIGSTOP (hang) or the worker's `stuck`
# fault (half-hang: health answers, tokens stop). Each peer and fault gets
# fresh workers.
#   bench/llm_failover.sh GPUHA_BINARY [SECONDS] [CONC]
set -euo pipefail
source "$(dirname "$0")/lib/procs.sh"
gpuha="$(realpath "${1:?usage: llm_failover.sh GPUHA_BINARY [SECONDS] [CONC]}")"
secs="${2:-8}"
conc="${3:-200}"
fault_at="${FAULT_AT:-3}"
faults="${FAULTS:-crash hang half-hang}"
for tool in nginx haproxy curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh" >&2; exit 2; }
done
work="$(mktemp -d /tmp/gpuha-llm.XXXXXX)"
pids=()
cleanup() { stop_procs "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
A=19501 C=19503 PROXY=19510

start_workers() {
  worker_pids=()
  for p in $A $C; do
    "$gpuha" worker --listen 127.0.0.1:$p --node "w$p" --ttft 50 --token-latency 20 \
      --capacity 100000 --threads 1 >/dev/null 2>&1 & worker_pids+=($!); pids+=($!)
  done
  sleep 0.3
}
stop_all() {
  [[ -n "${proxy_pid:-}" ]] && kill -TERM "$proxy_pid" 2>/dev/null || true
  for p in "${worker_pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  wait "${worker_pids[@]}" "$proxy_pid" 2>/dev/null || true
  proxy_pid=""
  sleep 0.3
}

# nginx as operators run it in front of SSE: proxy_buffering off, so tokens
# are not held back. "tuned" fails over on a silent upstream after 1 s.
nginx_conf() {  # $1 = default|tuned
  local extra="" server_opts=""
  if [[ $1 == tuned ]]; then
    extra="proxy_read_timeout 1s; proxy_connect_timeout 100ms; proxy_next_upstream error timeout http_502 http_503; proxy_next_upstream_tries 2;"
    server_opts="max_fails=1 fail_timeout=5s"
  fi
  cat > "$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  upstream llm { server 127.0.0.1:$A $server_opts; server 127.0.0.1:$C backup; keepalive 256; }
  server {
    listen 127.0.0.1:$PROXY;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffering off;
    $extra
    location /streams/ {
      rewrite ^/streams/[^/]+(/.*)\$ \$1 break;
      proxy_pass http://llm;
    }
  }
}
CONF
  nginx -p "$work" -c "$work/nginx.conf" & proxy_pid=$!; pids+=($!)
}

haproxy_conf() {  # $1 = default|tuned
  local check="check inter 2s fall 3" timeouts="timeout server 30s" retry="retries 3"
  if [[ $1 == tuned ]]; then
    check="check inter 100ms fall 2"
    timeouts="timeout server 1s"
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
  bind 127.0.0.1:$PROXY
  http-request set-path %[path,regsub(^/streams/[^/]+,)]
  default_backend llm
backend llm
  option httpchk GET /v2/health/ready
  server a 127.0.0.1:$A $check
  server c 127.0.0.1:$C $check backup
CONF
  haproxy -f "$work/haproxy.cfg" -db 2>"$work/haproxy.err" & proxy_pid=$!; pids+=($!)
}

router_conf() {
  {
    echo "listen: 127.0.0.1:$PROXY"
    echo "admin: 127.0.0.1:0"
    echo "threads: 1"
    echo "auth: none"
    echo "routes:"
    for i in $(seq 0 $((conc - 1))); do
      echo "  - {stream: llm-$i, primary: 127.0.0.1:$A, standby: 127.0.0.1:$C}"
    done
  } > "$work/router.yaml"
  "$gpuha" router --config "$work/router.yaml" >/dev/null 2>"$work/router.err" & proxy_pid=$!; pids+=($!)
}

load() {  # PORT [extra flags...]
  local port=$1
  shift
  "$gpuha" load --protocol sse --target 127.0.0.1:$port --streams "$conc" --stream-prefix llm- \
    --rate 0 --concurrency "$conc" --seconds "$secs" --timeout 5 --max-tokens 64 --quiet \
    --json "$work/out.json" "$@" >"$work/load.out" 2>&1
}

row() {  # $1 = peer, $2 = fault
  python3 - "$1" "$2" "$work/out.json" <<'PY'
import json, sys
peer, fault, path = sys.argv[1:]
r = json.load(open(path))
f = r["failures"]
def count(*keys):
    return sum(v for k, v in f.items() if any(k.startswith(x) for x in keys))
s = r["sse"]
classes = ("cut", "empty", "duplicated", "error event", "wrong")
other = ", ".join(f"{k} {v}" for k, v in f.items() if not k.startswith(classes)) or "0"
print(f"| {peer} | {fault} | {r['sent']} | {r['ok']} | {r['failed']} | {count('cut')} | "
      f"{count('empty')} | {count('duplicated')} | {count('wrong')} | {count('error event')} | {other} | "
      f"{s['gap_ms']['max']:.0f} | {r['max_stall_ms']:.0f} |")
PY
}

run_one() {  # $1 = peer label, $2 = setup command, $3 = crash|hang|half-hang
  rm -f "$work/out.json"
  start_workers
  $2
  sleep 1
  load $PROXY &
  local l=$!
  sleep "$fault_at"
  case $3 in
    crash) kill -9 "${worker_pids[0]}" ;;
    hang) kill -STOP "${worker_pids[0]}" ;;
    half-hang) curl -s -X POST "http://127.0.0.1:$A/v1/fault?mode=stuck" >/dev/null ;;
  esac
  wait "$l" || true
  [[ -s "$work/out.json" ]] || { echo "load produced no report for $1 / $3" >&2; cat "$work/load.out" >&2; exit 1; }
  row "$1" "$3"
  stop_all
}

echo "$conc concurrent streamed completions (max_tokens 64, 20 ms a token), ${secs} s, fault at ${fault_at} s."
echo "'whole' answers equal the model's uninterrupted answer exactly (text, finish reason, usage)."
echo
echo "| peer | fault | answers | whole | failed | cut | empty | duplicated | wrong text | error event | other failures | longest gap between tokens ms | longest wait for a token ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for fault in $faults; do
  run_one "gpuha router" router_conf "$fault"
  run_one "nginx (backup, buffering off)" "nginx_conf default" "$fault"
  run_one "nginx (tuned: read 1s, next_upstream)" "nginx_conf tuned" "$fault"
  run_one "HAProxy (inter 2s fall 3, redispatch)" "haproxy_conf default" "$fault"
  run_one "HAProxy (tuned: inter 100ms fall 2, server 1s)" "haproxy_conf tuned" "$fault"
done

echo
echo "## Relay overhead, no fault: the router against a direct connection"
echo
echo "| path | answers | tokens/s | time to first token p50 ms | p99 ms | gap between tokens p50 ms | p99 ms |"
echo "|---|---|---|---|---|---|---|"
overhead_row() {
  python3 - "$1" "$work/out.json" <<'PY'
import json, sys
label, path = sys.argv[1:]
r = json.load(open(path))
s = r["sse"]
print(f"| {label} | {r['ok']} (failed {r['failed']}) | {s['tokens'] / r['seconds']:.0f} | "
      f"{s['ttft_ms']['p50']:.1f} | {s['ttft_ms']['p99']:.1f} | {s['gap_ms']['p50']:.1f} | {s['gap_ms']['p99']:.1f} |")
PY
}
start_workers
load $A --direct
overhead_row "direct to the worker"
cp "$work/out.json" "$work/direct.json"
router_conf
sleep 1
load $PROXY
overhead_row "through the gpuha router"
python3 - "$work/direct.json" "$work/out.json" <<'PY'
import json, sys
d, r = (json.load(open(p)) for p in sys.argv[1:])
tps = lambda x: x["sse"]["tokens"] / x["seconds"]
print()
print(f"Router / direct: tokens per second {tps(r) / tps(d):.3f}, "
      f"time to first token p50 {r['sse']['ttft_ms']['p50'] / d['sse']['ttft_ms']['p50']:.3f}, "
      f"p99 {r['sse']['ttft_ms']['p99'] / d['sse']['ttft_ms']['p99']:.3f}")
PY
stop_all
