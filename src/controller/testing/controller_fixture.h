// The controller on a fake clock, a memory store, fake agent sinks and a
// fake fence hook: the fixture the controller's unit tests share.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/controller.h"

namespace gpuha::controller {

using std::chrono::milliseconds;

class FakeSink : public AgentSink {
 public:
  void Send(const v1::ControllerMessage& m) override { sent.push_back(m); }
  int fences() const {
    int n = 0;
    for (const auto& m : sent) n += m.has_fence();
    return n;
  }
  int rejoins() const {
    int n = 0;
    for (const auto& m : sent) n += m.has_rejoin();
    return n;
  }
  uint64_t last_fence_epoch() const {
    uint64_t e = 0;
    for (const auto& m : sent) e = m.has_fence() ? m.fence().epoch() : e;
    return e;
  }
  std::vector<v1::ControllerMessage> sent;
};

class FakeFencer : public FenceRunner {
 public:
  absl::Status Run(const std::string& command, common::Duration) override {
    std::lock_guard<std::mutex> lock(mu);
    commands.push_back(command);
    return result;
  }
  std::mutex mu;
  std::vector<std::string> commands;
  absl::Status result = absl::OkStatus();
};

inline ControllerConfig ThreePlusOne() {
  ControllerConfig c;
  c.redundancy = 1;
  for (int i = 1; i <= 3; ++i) {
    c.nodes.push_back(
        {{"a" + std::to_string(i), Role::kActive, 10}, "127.0.0.1:800" + std::to_string(i)});
  }
  c.nodes.push_back({{"p1", Role::kPassive, 10}, "127.0.0.1:8004"});
  c.tenants = {"acme"};
  c.startup_grace = milliseconds(0);
  c.healthy_for = milliseconds(500);
  return c;
}

class ControllerTest : public ::testing::Test {
 protected:
  void Start(ControllerConfig config = ThreePlusOne(), std::unique_ptr<Store> store = nullptr) {
    if (!store) store = std::make_unique<MemoryStore>();
    c_ = std::make_unique<Controller>(config, std::move(store), &clock_, &fencer_);
    ASSERT_TRUE(c_->Recover().ok());
    // Each node joins: its agent connects and says its server is ready.
    for (const NodeConfig& n : config.nodes) Connect(n.spec.id);
    for (const NodeConfig& n : config.nodes) Beat(n.spec.id);
  }
  void Connect(const std::string& node) {
    sinks_[node] = std::make_shared<FakeSink>();
    v1::Hello hello;
    hello.set_node(node);
    ASSERT_TRUE(c_->AgentConnected(hello, sinks_[node], /*proven=*/true).ok());
  }
  void Beat(const std::string& node, v1::NodeHealth health = v1::NODE_HEALTH_HEALTHY,
            bool fenced = false, uint64_t epoch = 0) {
    v1::Heartbeat hb;
    hb.set_health(health);
    hb.set_fenced(fenced);
    hb.set_epoch(epoch == 0 ? c_->epoch() : epoch);
    // The agent's server answers its readiness probe unless it is fenced.
    hb.mutable_server()->set_running(!fenced);
    hb.mutable_server()->set_ready(!fenced);
    if (health != v1::NODE_HEALTH_HEALTHY) {
      auto* r = hb.add_reasons();
      r->set_code("gpu0.test");
      r->set_detail("injected");
    }
    c_->AgentHeartbeat(node, hb);
  }
  // A healthy agent whose server runs, ready or not (starting, stuck).
  void BeatServer(const std::string& node, bool ready) {
    v1::Heartbeat hb;
    hb.set_health(v1::NODE_HEALTH_HEALTHY);
    hb.set_epoch(c_->epoch());
    hb.mutable_server()->set_running(true);
    hb.mutable_server()->set_ready(ready);
    c_->AgentHeartbeat(node, hb);
  }
  // Advances time in 10 ms steps; every node in `alive` heartbeats every 50 ms.
  void Run(milliseconds d, const std::vector<std::string>& alive) {
    for (milliseconds t(0); t < d; t += milliseconds(10)) {
      clock_.Advance(milliseconds(10));
      if ((elapsed_ += 10) % 50 == 0) {
        for (const std::string& n : alive) Beat(n);
      }
      c_->Tick();
    }
  }
  void AddStreams(int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(c_->AddStream({"cam-" + std::to_string(i), "acme", 1}).ok());
    }
  }
  std::vector<std::string> EventTypes(const std::string& node = "") {
    std::vector<std::string> out;
    for (const Event& e : c_->EventsSince(0)) {
      if (node.empty() || e.node == node || e.node.empty()) out.push_back(e.type);
    }
    return out;
  }
  std::vector<std::string> EventDetails(const std::string& node) {
    std::vector<std::string> out;
    for (const Event& e : c_->EventsSince(0)) {
      if (e.node == node) out.push_back(e.detail);
    }
    return out;
  }
  int64_t IndexOf(const std::string& type) {
    for (const Event& e : c_->EventsSince(0)) {
      if (e.type == type) return e.id;
    }
    return -1;
  }

  common::FakeClock clock_;
  FakeFencer fencer_;
  std::unique_ptr<Controller> c_;
  std::map<std::string, std::shared_ptr<FakeSink>> sinks_;
  int64_t elapsed_ = 0;
};

}  // namespace gpuha::controller
