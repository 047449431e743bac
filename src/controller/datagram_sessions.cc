#include "controller/datagram_sessions.h"

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

absl::StatusOr<DatagramSessions::Offer> DatagramSessions::Start(const std::string& node) {
  Offer offer{.key = common::RandomBytes(common::kDatagramKeyBytes)};
  absl::StatusOr<std::unique_ptr<common::DatagramKey>> mac = common::DatagramKey::Create(offer.key);
  if (!mac.ok()) return mac.status();
  absl::MutexLock lock(&mu_);
  do {
    offer.session = common::RandomSession();
  } while (open_.count(offer.session) > 0);
  open_[offer.session] = {node, std::move(*mac)};
  return offer;
}

void DatagramSessions::End(uint64_t session) {
  if (session == 0) return;
  absl::MutexLock lock(&mu_);
  open_.erase(session);
  if (ended_sessions_.insert(session).second) ended_order_.push_back(session);
  if (ended_order_.size() > kEndedKept) {
    ended_sessions_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

absl::Status DatagramSessions::Ended(uint64_t session) {
  return absl::AlreadyExistsError(
      absl::StrCat("bytes 4-11: session ", session, " ended (a late datagram)"));
}

absl::StatusOr<DatagramSessions::Beat> DatagramSessions::Verify(absl::string_view datagram) {
  absl::StatusOr<uint64_t> session = common::DatagramSession(datagram);
  if (!session.ok()) return session.status();
  Session open;
  bool ended = false;
  {
    // Held for the lookup only: the MAC is checked without it.
    absl::MutexLock lock(&mu_);
    if (auto it = open_.find(*session); it != open_.end()) {
      open = it->second;
    } else {
      ended = ended_sessions_.count(*session) > 0;
    }
  }
  if (!open.key) {
    if (ended) return Ended(*session);
    return absl::NotFoundError(
        absl::StrCat("bytes 4-11: session ", *session, " is no connected agent's"));
  }
  absl::StatusOr<absl::string_view> payload = common::OpenDatagram(datagram, *open.key);
  if (!payload.ok()) return payload.status();
  Beat beat{.session = *session, .node = std::move(open.node)};
  if (!beat.heartbeat.ParseFromArray(payload->data(), static_cast<int>(payload->size()))) {
    return absl::InvalidArgumentError(absl::StrCat("bytes 44-", datagram.size() - 1, " of node '",
                                                   beat.node, "': not a Heartbeat message"));
  }
  return beat;
}

}  // namespace gpuha::controller
