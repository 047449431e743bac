// DatagramSessions: the agents' heartbeat datagram sessions (UDP, HMAC;
// common/heartbeat_datagram.h): each connected agent's session id and key,
// made at its welcome, and the sessions ended lately, whose late datagrams
// are stale rather than forged. A datagram is verified (its session, its
// MAC, its Heartbeat) under this unit's own lock, never the controller's: a
// flood of forged datagrams costs the UDP thread, not the controller.
//
//   DatagramSessions sessions;
//   auto offer = sessions.Start("gpu-2");      // id and key for the welcome
//   auto beat = sessions.Verify(datagram);     // on the UDP thread
//   sessions.End(offer->session);              // a reconnect, a fallback
//
// Thread-safety: Start and End from any thread; Verify from one thread (the
// UDP thread: a session's key is that thread's alone once made). The
// controller takes this lock after its own, never before it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/heartbeat_datagram.h"
#include "gpuha/v1/agent.pb.h"

namespace gpuha::controller {

class DatagramSessions {
 public:
  // How many ended sessions are remembered as ended (the newest).
  static constexpr size_t kEndedKept = 4096;

  struct Offer {
    uint64_t session = 0;
    std::string key = {};  // kDatagramKeyBytes, for the agent's welcome
  };
  // A new session for `node`'s agent, with an id no open session has.
  [[nodiscard]] absl::StatusOr<Offer> Start(const std::string& node);
  // Ends `session` (0: none): its datagrams are late from now on.
  void End(uint64_t session);

  struct Beat {
    uint64_t session = 0;
    std::string node = {};
    v1::Heartbeat heartbeat = {};
  };
  // One datagram, verified. AlreadyExists: a session that ended (a late
  // datagram); any other error refuses it, naming the bytes.
  [[nodiscard]] absl::StatusOr<Beat> Verify(absl::string_view datagram);
  // What a datagram of an ended session is told (AlreadyExists).
  static absl::Status Ended(uint64_t session);

 private:
  struct Session {
    std::string node;
    std::shared_ptr<common::DatagramKey> key;
  };
  absl::Mutex mu_;
  std::map<uint64_t, Session> open_ ABSL_GUARDED_BY(mu_);
  // Ended lately, oldest first: the newest kEndedKept.
  std::deque<uint64_t> ended_order_ ABSL_GUARDED_BY(mu_);
  std::unordered_set<uint64_t> ended_sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuha::controller
