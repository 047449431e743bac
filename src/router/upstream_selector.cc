#include "router/upstream_selector.h"

namespace gpuha::router {

bool StickyTable::Stuck(std::string_view stream, std::string_view primary, std::string_view standby,
                        bool primary_usable, common::TimePoint now) {
  if (entries_.empty()) return false;
  auto it = entries_.find(stream);
  if (it == entries_.end()) return false;
  const Entry& e = it->second;
  if (e.primary != primary || e.standby != standby) {
    entries_.erase(it);  // the controller moved the stream: its routes win
    return false;
  }
  if (now - e.since >= hold_ && primary_usable) {
    entries_.erase(it);  // the primary the controller kept is back
    return false;
  }
  return true;
}

void StickyTable::Stick(std::string_view stream, std::string_view primary, std::string_view standby,
                        common::TimePoint now) {
  auto it = entries_.find(stream);
  if (it == entries_.end()) it = entries_.emplace(std::string(stream), Entry{}).first;
  it->second = {std::string(primary), std::string(standby), now};
}

}  // namespace gpuha::router
