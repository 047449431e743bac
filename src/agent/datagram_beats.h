// DatagramBeats: the agent's side of heartbeat datagrams (agent.proto's
// HeartbeatDatagrams). A heartbeat that says nothing new (the same state as
// the one before it, no telemetry, no XIDs) goes as one UDP datagram instead
// of a stream message; everything else, and everything until the controller
// says it heard a datagram, goes on the stream.
//
//   beats.Reset();                                  // a new stream
//   beats.Open(ctx.peer(), welcome.datagrams());    // the controller offers
//   beats.Heard(session);                           // DatagramsHeard
//   beats.Lost(session);                            // DatagramsLost: stream only
//   if (!beats.Send(&hb)) stream->Write(hb);
//
// Thread-safety: none; the connection thread owns it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/heartbeat_datagram.h"
#include "common/udp.h"
#include "gpuha/v1/agent.pb.h"

namespace gpuha::agent {

class DatagramBeats {
 public:
  // `send_errors`, if set, counts datagrams the kernel refused.
  explicit DatagramBeats(std::atomic<uint64_t>* send_errors = nullptr)
      : send_errors_(send_errors) {}
  void Reset();
  // Sends datagrams to the offer's port on the host `grpc_peer` names (the
  // address the stream reached). On error datagrams stay off.
  absl::Status Open(absl::string_view grpc_peer, const v1::HeartbeatDatagrams& offer);
  void Heard(uint64_t session);
  // DatagramsLost: every beat goes on the stream until the next Open().
  // False when `session` is not the open one (a late word).
  bool Lost(uint64_t session);
  // True when `hb` went as a datagram and the stream need not carry it.
  // Before Heard(), a beat that could go is sent both ways (the controller
  // drops the second copy by its seq). `hb` is as it was on return (its
  // seq and time are set aside while its state is serialized).
  bool Send(v1::Heartbeat* hb);
  bool heard() const { return heard_; }

 private:
  std::atomic<uint64_t>* const send_errors_;
  std::unique_ptr<common::UdpSender> tx_;
  uint64_t session_ = 0;
  std::unique_ptr<common::DatagramKey> key_;
  bool heard_ = false;
  std::string last_state_;  // the previous heartbeat without seq, time and telemetry
};

}  // namespace gpuha::agent
