// Two real gpuha workers serving the language model with short token
// times, for the router's in-process tests of token streams (primary "a",
// standby "b").
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <utility>

#include "worker/worker.h"

namespace gpuha::router::testing {

// `strict_fields`: both refuse fields that are not OpenAI's, as OpenAI's
// own API does.
inline void StartLlmWorkers(std::unique_ptr<worker::Worker>* a, std::unique_ptr<worker::Worker>* b,
                            bool strict_fields = false) {
  for (auto [w, name] : {std::pair{a, "a"}, std::pair{b, "b"}}) {
    worker::WorkerOptions o;
    o.port = 0;
    o.node = name;
    o.strict_fields = strict_fields;
    o.ttft = std::chrono::milliseconds(5);
    o.token_latency = std::chrono::milliseconds(5);
    auto s = worker::Worker::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    *w = std::move(*s);
  }
}

}  // namespace gpuha::router::testing
