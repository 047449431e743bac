#include "router/route_table.h"

#include <set>

namespace gpuha::router {

std::shared_ptr<const RouteTable> RouteTable::FromSnapshot(const v1::RouteSnapshot& s) {
  auto t = std::make_shared<RouteTable>();
  t->version_ = s.version();
  t->epoch_ = s.epoch();
  for (const v1::Route& r : s.routes()) {
    RouteEntry e{r.stream(),
                 r.tenant(),
                 {r.primary().node(), r.primary().address(), r.primary().grpc_address()},
                 {r.standby().node(), r.standby().address(), r.standby().grpc_address()}};
    t->streams_.emplace(r.stream(), std::move(e));
  }
  t->Index();
  return t;
}

std::shared_ptr<const RouteTable> RouteTable::FromStatic(const std::vector<StaticRoute>& routes) {
  auto t = std::make_shared<RouteTable>();
  t->version_ = 1;
  for (const StaticRoute& r : routes) {
    t->streams_.emplace(r.stream, RouteEntry{r.stream,
                                             r.tenant,
                                             {r.primary, r.primary, r.primary_grpc},
                                             {r.standby, r.standby, r.standby_grpc}});
  }
  t->Index();
  return t;
}

void RouteTable::Index() {
  std::set<std::string> seen;
  // Sorted, so every router builds the same order from the same routes.
  std::map<std::string, const RouteEntry*> sorted;
  for (const auto& [id, e] : streams_) sorted[id] = &e;
  for (const auto& [id, e] : sorted) {
    for (const Upstream* u : {&e->primary, &e->standby}) {
      if (!u->empty() && seen.insert(u->address).second) upstreams_.push_back(*u);
    }
  }
}

const RouteEntry* RouteTable::Find(std::string_view stream) const {
  auto it = streams_.find(stream);
  return it == streams_.end() ? nullptr : &it->second;
}

}  // namespace gpuha::router
