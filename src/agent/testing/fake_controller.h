// FakeController: a small in-test controller speaking proto/gpuha/v1's
// AgentService, until the real controller exists. Records every hello and
// heartbeat (and goodbye) and can send commands down an agent's stream.
//
//   FakeController c;           // listens on 127.0.0.1, ephemeral port
//   agent_config.controllers = {{"127.0.0.1", c.port()}};
//   auto hb = c.WaitForHeartbeat([](const v1::Heartbeat& h) { return h.xids_size() > 0; });
//
// With OfferDatagrams() it welcomes each agent with a heartbeat datagram
// session as the real controller does, and records the datagrams it can
// open (heartbeats() then holds beats from both paths, each seq once).
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/heartbeat_datagram.h"
#include "common/udp.h"
#include "gpuha/v1/agent.grpc.pb.h"

namespace gpuha::agent::testing {

class FakeController final : public v1::AgentService::Service {
 public:
  explicit FakeController(uint16_t port = 0,
                          std::shared_ptr<grpc::ServerCredentials> creds =
                              grpc::InsecureServerCredentials()) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(port), creds, &port_);
    b.RegisterService(this);
    b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // as the real controller
    server_ = b.BuildAndStart();
  }
  ~FakeController() override { Shutdown(); }

  int port() const { return port_; }
  // Each hello is answered with a welcome that offers heartbeat datagrams.
  void OfferDatagrams() {
    datagram_key_ = common::DatagramKey::Create(kDatagramKey).value();
    auto rx = common::UdpReceiver::Start({"127.0.0.1", 0}, [this](absl::string_view d) {
      absl::StatusOr<absl::string_view> payload = common::OpenDatagram(d, *datagram_key_);
      v1::Heartbeat hb;
      if (!payload.ok() || !hb.ParseFromArray(payload->data(), static_cast<int>(payload->size()))) {
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (hb.seq() <= beat_seq_) return;
      beat_seq_ = hb.seq();
      ++datagrams_;
      heartbeats_.push_back({hb, std::chrono::steady_clock::now()});
      if (datagrams_ == 1) {
        v1::ControllerMessage heard;
        heard.mutable_datagrams_heard()->set_session(kDatagramSession);
        outbox_.push_back(heard);
      }
      cv_.notify_all();
    });
    if (rx.ok()) datagram_rx_ = std::move(*rx);
  }
  // Tells the agent its datagrams stopped arriving (DatagramsLost).
  void SayDatagramsLost() {
    v1::ControllerMessage lost;
    lost.mutable_datagrams_lost()->set_session(kDatagramSession);
    lost.mutable_datagrams_lost()->set_reason("none arrived (test)");
    Send(lost);
  }
  size_t datagram_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return datagrams_;
  }
  void Shutdown() {
    if (datagram_rx_) datagram_rx_->Stop();
    if (!server_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    server_.reset();
  }

  grpc::Status Connect(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* stream) override {
    std::thread writer([&] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!ctx->IsCancelled() && !closing_) {
        cv_.wait_for(lock, std::chrono::milliseconds(20));
        while (!outbox_.empty()) {
          v1::ControllerMessage m = outbox_.front();
          outbox_.pop_front();
          lock.unlock();
          stream->Write(m);
          lock.lock();
        }
      }
    });
    v1::AgentMessage m;
    while (stream->Read(&m)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (m.has_hello()) {
        hellos_.push_back(m.hello());
        beat_seq_ = 0;
        if (datagram_rx_) {
          v1::ControllerMessage w;
          v1::HeartbeatDatagrams* d = w.mutable_welcome()->mutable_datagrams();
          d->set_port(datagram_rx_->port());
          d->set_session(kDatagramSession);
          d->set_key(kDatagramKey);
          outbox_.push_back(w);
        }
      }
      // With datagrams, a beat both paths brought is recorded once (such a
      // beat carries no telemetry and no XIDs; one that does always counts).
      const v1::Heartbeat& h = m.heartbeat();
      if (m.has_heartbeat() && (!datagram_rx_ || h.seq() > beat_seq_ || h.gpus_size() > 0 ||
                                h.nics_size() > 0 || h.xids_size() > 0)) {
        beat_seq_ = std::max(beat_seq_, m.heartbeat().seq());
        heartbeats_.push_back({m.heartbeat(), std::chrono::steady_clock::now()});
      }
      if (m.has_goodbye()) goodbyes_.push_back(m.goodbye());
      cv_.notify_all();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++streams_closed_;
      closing_stream_ = true;
    }
    cv_.notify_all();
    ctx->TryCancel();
    writer.join();
    return grpc::Status::OK;
  }

  void Send(const v1::ControllerMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.push_back(m);
    cv_.notify_all();
  }

  struct Received {
    v1::Heartbeat heartbeat;
    std::chrono::steady_clock::time_point at;
  };

  // Waits for a heartbeat received after call time that matches `pred`.
  std::optional<Received> WaitForHeartbeat(
      const std::function<bool(const v1::Heartbeat&)>& pred,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000), size_t from = SIZE_MAX) {
    std::unique_lock<std::mutex> lock(mu_);
    size_t i = from == SIZE_MAX ? heartbeats_.size() : from;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      for (; i < heartbeats_.size(); ++i) {
        if (pred(heartbeats_[i].heartbeat)) return heartbeats_[i];
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && i >= heartbeats_.size()) {
        return std::nullopt;
      }
    }
  }

  std::optional<v1::Hello> WaitForHello(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !hellos_.empty(); })) return std::nullopt;
    return hellos_.back();
  }

  std::optional<v1::Goodbye> WaitForGoodbye(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !goodbyes_.empty(); })) return std::nullopt;
    return goodbyes_.back();
  }

  size_t heartbeat_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_.size();
  }
  std::vector<Received> heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  size_t hello_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return hellos_.size();
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closing_ = false;
  bool closing_stream_ = false;
  int streams_closed_ = 0;
  std::vector<v1::Hello> hellos_;
  std::vector<v1::Goodbye> goodbyes_;
  std::vector<Received> heartbeats_;
  std::deque<v1::ControllerMessage> outbox_;
  static constexpr uint64_t kDatagramSession = 0x6770756861ULL;
  inline static const std::string kDatagramKey = std::string(common::kDatagramKeyBytes, 'k');
  std::unique_ptr<common::DatagramKey> datagram_key_;  // its receiver thread's
  std::unique_ptr<common::UdpReceiver> datagram_rx_;
  uint64_t beat_seq_ = 0;  // the newest heartbeat's, by either path
  size_t datagrams_ = 0;
};

}  // namespace gpuha::agent::testing
