# Sourced by the benchmarks that start peers and backends.
#
# stop_procs PID...: SIGCONT (a backend left SIGSTOPped), SIGTERM, up to 2 s
# for them to go, then SIGKILL. nginx's master takes its workers with it on
# SIGTERM only: a SIGKILL of the master leaves its workers listening on the
# proxy port, and every later run, whatever peer it starts, measures that
# orphaned nginx. That was the broken SIGSTOP row of 2026-12-01 (a run cut
# by `timeout` left one; all seven peers then failed the same 4,024
# requests, nginx-at-defaults' figure).
stop_procs() {
  local p
  for p in "$@"; do kill -CONT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 40); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.05
  done
  for p in "$@"; do kill -9 "$p" 2>/dev/null || true; done
  wait "$@" 2>/dev/null || true
}

# require_free_ports PORT...: exits 2, naming the port, when something
# already listens on one (a peer left from an earlier run would be measured
# in place of the one started).
require_free_ports() {
  local p
  for p in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "port $p is already in use (a peer left from an earlier run?): stop it first" >&2
      exit 2
    fi
  done
}
