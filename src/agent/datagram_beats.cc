#include "agent/datagram_beats.h"

#include "absl/strings/str_cat.h"
#include "common/heartbeat_datagram.h"

namespace gpuha::agent {

void DatagramBeats::Reset() {
  tx_.reset();
  session_ = 0;
  key_.reset();
  heard_ = false;
  last_state_.clear();
}

absl::Status DatagramBeats::Open(absl::string_view grpc_peer, const v1::HeartbeatDatagrams& offer) {
  Reset();
  if (offer.port() == 0 || offer.port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("datagrams.port ", offer.port(), " is no port"));
  }
  if (offer.key().size() != common::kDatagramKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("datagrams.key has ", offer.key().size(),
                                                   " bytes, not ", common::kDatagramKeyBytes));
  }
  absl::StatusOr<std::string> host = common::GrpcPeerHost(grpc_peer);
  if (!host.ok()) return host.status();
  absl::StatusOr<std::unique_ptr<common::DatagramKey>> key =
      common::DatagramKey::Create(offer.key());
  if (!key.ok()) return key.status();
  auto tx = common::UdpSender::Open({*host, static_cast<uint16_t>(offer.port())});
  if (!tx.ok()) return tx.status();
  tx_ = std::move(*tx);
  session_ = offer.session();
  key_ = std::move(*key);
  return absl::OkStatus();
}

void DatagramBeats::Heard(uint64_t session) {
  if (tx_ && session == session_) heard_ = true;
}

bool DatagramBeats::Lost(uint64_t session) {
  if (!tx_ || session != session_) return false;
  Reset();
  return true;
}

bool DatagramBeats::Send(v1::Heartbeat* beat) {
  const v1::Heartbeat& hb = *beat;
  const bool news = hb.gpus_size() > 0 || hb.nics_size() > 0 || hb.xids_size() > 0;
  // The state: the beat without its seq and send time (and telemetry). A
  // quiet beat is serialized once: protobuf's wire format concatenates, so
  // its datagram is the two head fields' bytes then these.
  std::string state;
  if (news) {
    v1::Heartbeat copy = hb;  // twice a second at most: a sample, an XID
    copy.clear_seq();
    copy.clear_sent_unix_nanos();
    copy.clear_gpus();
    copy.clear_nics();
    copy.clear_xids();
    state = copy.SerializeAsString();
  } else {
    const uint64_t seq = beat->seq();
    const int64_t sent = beat->sent_unix_nanos();
    beat->clear_seq();
    beat->clear_sent_unix_nanos();
    state = beat->SerializeAsString();
    beat->set_seq(seq);
    beat->set_sent_unix_nanos(sent);
  }
  const bool same = state == last_state_;
  last_state_ = std::move(state);
  if (!tx_ || !same || news) return false;
  v1::Heartbeat head;
  head.set_seq(hb.seq());
  head.set_sent_unix_nanos(hb.sent_unix_nanos());
  const std::string payload = head.SerializeAsString() + last_state_;
  if (common::kDatagramHeaderBytes + payload.size() > common::kMaxDatagramBytes) return false;
  // A datagram the kernel would not take (no route, a full buffer) goes on
  // the stream instead.
  if (!tx_->Send(common::SealDatagram(session_, *key_, payload)).ok()) {
    if (send_errors_ != nullptr) ++*send_errors_;
    return false;
  }
  return heard_;
}

}  // namespace gpuha::agent
