// RouterAcks: which route version each router connected to this controller
// holds, from its acks, and when every one of them holds the newest: the
// moment a failover's routes are in force everywhere (the routers_acked
// event, the last step FailoverTimings measures), said once per version.
//
//   RouterAcks acks;
//   if (acks.Ack("r1", 7, /*current=*/7)) Event("routers_acked", ...);
//   acks.Gone("r1");                      // its stream ended
//
// Thread-safety: none; the controller holds its lock around it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace gpuha::controller {

class RouterAcks {
 public:
  // `router` holds `version`. True when, with this ack, every router holds
  // `current` (the controller's newest version) for the first time.
  bool Ack(const std::string& router, uint64_t version, uint64_t current);
  // `router` left (its route watch ended): it holds nothing any more.
  void Gone(const std::string& router) { held_.erase(router); }
  // The version each router holds, by name.
  const std::map<std::string, uint64_t>& held() const { return held_; }

 private:
  std::map<std::string, uint64_t> held_;
  uint64_t said_ = 0;  // the last version said held by all
};

}  // namespace gpuha::controller
