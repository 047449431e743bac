// Eventually: waits on a condition instead of a fixed sleep. Polls `pred`
// every `poll` until it holds or `timeout` passes; true when it held.
//
//   ASSERT_TRUE(Eventually([&] { return agent->connected(); }));
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace gpuha::testing {

inline bool Eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(5000),
                       std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace gpuha::testing
