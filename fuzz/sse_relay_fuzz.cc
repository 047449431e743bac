// libFuzzer target for the router's LLM relay (router/sse_relay.h): an
// upstream's arbitrary body bytes, cut into arbitrary pieces, go through
// SseContinuity, and at an arbitrary point the answer breaks and is
// continued. What an upstream sends is input too. Checked on every input:
// - while the stream is followed, the client gets whole events only;
// - the continuation request is a JSON object whose budget has shrunk by
//   the tokens delivered (by text), or whose prompt is token IDs and whose
//   budget has not grown (on token IDs, asked for when data[0] & 2);
// - the error event parses as an event.
// Built and run by scripts/fuzz-router.sh.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/sse.h"
#include "router/sse_relay.h"

using gpuha::router::LlmApi;
using gpuha::router::SseContinuity;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const LlmApi api = data[0] & 1 ? LlmApi::kChat : LlmApi::kCompletions;
  const size_t piece = 1 + data[1] % 64;  // the size of each read
  const size_t break_at = data[2];        // the piece after which the answer breaks
  std::string_view body(reinterpret_cast<const char*>(data + 3), size - 3);
  const std::string request =
      api == LlmApi::kChat
          ? R"({"model":"m","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"q"}]})"
          : R"({"model":"m","stream":true,"max_tokens":50,"prompt":"p"})";
  auto call = gpuha::router::ReadLlmCall(api, request);
  if (!call.ok()) __builtin_trap();
  gpuha::router::TokenIdContinuation ids;
  if (data[0] & 2) ids = {.ask = true, .completions_path = "/v1/completions"};
  SseContinuity sc(api, std::move(*call), "", 4096, ids);
  std::string out;
  size_t n = 0;
  for (size_t at = 0; at < body.size(); at += piece, ++n) {
    std::string got;
    sc.Feed(body.substr(at, piece), &got);
    // Followed (not opaque): whole events only.
    if (!sc.CannotContinue() && !sc.done() && !got.empty() && got.substr(got.size() - 1) != "\n") {
      __builtin_trap();
    }
    out += got;
    if (n == break_at && !sc.CannotContinue() && !sc.OnlyTheEndIsMissing()) {
      const int before = sc.tokens();
      nlohmann::json next = nlohmann::json::parse(sc.BeginContinuation(), nullptr, false);
      if (!next.is_object()) __builtin_trap();
      if (sc.by_token_ids()) {
        if (!next["prompt"].is_array() || next.contains("messages") ||
            !next["max_tokens"].is_number_integer() || next["max_tokens"].get<int64_t>() > 50) {
          __builtin_trap();
        }
      } else if (next["max_tokens"] != 50 - before) {
        __builtin_trap();
      }
    }
  }
  std::string error = SseContinuity::ErrorEvent(std::string(body.substr(0, 64)));
  if (gpuha::common::ParseSseEvent(error).event != "error") __builtin_trap();
  return 0;
}
