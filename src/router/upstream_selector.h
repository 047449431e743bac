// UpstreamSelector: the order in which one request tries upstreams, and the
// sticky rule. Pure policy: no sockets, time as an argument.
//
// A stream goes to its primary, then its standby. It goes to the standby
// first while the primary is not usable, and while it is stuck: a stream
// whose primary failed in the router stays on its standby until the
// controller's routes for it change, or until `hold` has passed and the
// primary is usable again (a primary that only blinked, and that the
// controller kept, gets its work back).
//
//   StickyTable sticky(config.sticky);
//   bool stuck = sticky.Stuck(id, primary_addr, standby_addr, primary->usable(now), now);
//   auto order = StreamOrder(primary, standby, stuck, now);
//   DropUnfit(order, now);           // down/hung out; usable before ejected
//   ... primary failed: sticky.Stick(id, primary_addr, standby_addr, now);
//
// U is any type derived from UpstreamHealth (the router's UpstreamState; the
// tests use UpstreamHealth itself).
// Thread-safety: none; each event loop keeps its own table.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "absl/container/inlined_vector.h"
#include "common/clock.h"
#include "router/route_table.h"
#include "router/upstream_health.h"

namespace gpuha::router {

template <class U>
using UpstreamOrder = absl::InlinedVector<U*, 4>;

class StickyTable {
 public:
  explicit StickyTable(common::Duration hold) : hold_(hold) {}

  // Whether `stream` should try its standby first. An entry made under other
  // routes, or whose hold has passed while the primary is usable, is dropped.
  bool Stuck(std::string_view stream, std::string_view primary, std::string_view standby,
             bool primary_usable, common::TimePoint now);
  // The stream's primary failed under these routes: stay on the standby.
  void Stick(std::string_view stream, std::string_view primary, std::string_view standby,
             common::TimePoint now);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string primary, standby;  // the stream's routes when it failed over
    common::TimePoint since;
  };
  common::Duration hold_;
  std::unordered_map<std::string, Entry, StringHash, std::equal_to<>> entries_;
};

// Insertion sort: stable, and no temporary buffer (std::stable_sort and
// std::stable_partition allocate one per call) for the few upstreams a
// request chooses among.
template <class V, class Less>
void SmallStableSort(V& v, Less less) {
  for (size_t i = 1; i < v.size(); ++i) {
    for (size_t j = i; j > 0 && less(v[j], v[j - 1]); --j) std::swap(v[j], v[j - 1]);
  }
}

// A stream's upstreams: {primary, standby}, or {standby, primary} when the
// stream is stuck or its primary is not usable. `standby` may be null.
template <class U>
UpstreamOrder<U> StreamOrder(U* primary, U* standby, bool stuck, common::TimePoint now) {
  static_assert(std::is_base_of_v<UpstreamHealth, U>);
  if (standby != nullptr && (stuck || !primary->usable(now))) return {standby, primary};
  UpstreamOrder<U> order = {primary};
  if (standby != nullptr) order.push_back(standby);
  return order;
}

// Down, hung and unresolvable upstreams are dropped; ejected ones stay as a
// last resort, behind the usable ones.
template <class U>
void DropUnfit(UpstreamOrder<U>& order, common::TimePoint now) {
  static_assert(std::is_base_of_v<UpstreamHealth, U>);
  order.erase(
      std::remove_if(order.begin(), order.end(), [](const U* u) { return !u->candidate(); }),
      order.end());
  SmallStableSort(order, [&](const U* a, const U* b) { return a->usable(now) && !b->usable(now); });
}

}  // namespace gpuha::router
