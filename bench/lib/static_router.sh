# Sourced by the router benchmarks: the gpuha router's config for their
# fixed layout, 20 streams cam-0..19 with primary A (cam-0..9) or B
# (cam-10..19) and standby C, one loop, no controller and no tenants.
#   static_router_yaml FILE LISTEN_PORT A B C [ADMIN_PORT]   (no ADMIN_PORT: any free one)
static_router_yaml() {
  local file=$1 listen=$2 a=$3 b=$4 c=$5 admin=${6:-}
  {
    echo "listen: 127.0.0.1:$listen"
    echo "admin: 127.0.0.1:${admin:-0}"
    echo "threads: 1"
    echo "auth: none"
    echo "routes:"
    local i primary
    for i in $(seq 0 19); do
      primary=$([[ $i -lt 10 ]] && echo "$a" || echo "$b")
      echo "  - {stream: cam-$i, primary: 127.0.0.1:$primary, standby: 127.0.0.1:$c}"
    done
  } > "$file"
}
