#include "agent/datagram_beats.h"

#include "absl/strings/str_cat.h"
#include "common/heartbeat_datagram.h"

namespace gpuha::agent {

void DatagramBeats::Reset() {
  tx_.reset();
  session_ = 0;
  key_.clear();
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
  auto tx = common::UdpSender::Open({*host, static_cast<uint16_t>(offer.port())});
  if (!tx.ok()) return tx.status();
  tx_ = std::move(*tx);
  session_ = offer.session();
  key_ = offer.key();
  return absl::OkStatus();
}

void DatagramBeats::Heard(uint64_t session) {
  if (tx_ && session == session_) heard_ = true;
}

bool DatagramBeats::Send(const v1::Heartbeat& hb) {
  v1::Heartbeat state = hb;
  state.clear_seq();
  state.clear_sent_unix_nanos();
  state.clear_gpus();
  state.clear_nics();
  state.clear_xids();
  std::string s = state.SerializeAsString();
  const bool same = s == last_state_;
  last_state_ = std::move(s);
  if (!tx_ || !same || hb.gpus_size() > 0 || hb.nics_size() > 0 || hb.xids_size() > 0) {
    return false;
  }
  const std::string payload = hb.SerializeAsString();
  if (common::kDatagramHeaderBytes + payload.size() > common::kMaxDatagramBytes) return false;
  // A datagram the kernel would not take (no route, a full buffer) goes on
  // the stream instead.
  if (!tx_->Send(common::SealDatagram(session_, key_, payload)).ok()) return false;
  return heard_;
}

}  // namespace gpuha::agent
