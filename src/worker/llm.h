// The reference worker's language model, "gpuha-tiny", and the OpenAI
// completions protocol around it. Pure functions, shared by the worker (to
// serve), by `gpuha load --protocol sse` (to check every answer) and by the
// tests.
//
// The model is deterministic and has no weights: the next token is a
// function of the whole text so far (the rendered prompt and every token
// generated), drawn from a 64-word vocabulary by an FNV-1a hash of that
// text. Hence:
//   - the same prompt always gives the same answer;
//   - a continuation from any prefix of an answer (the prompt extended by
//     the tokens already given) gives exactly the rest of that answer.
// That second property is what makes the router's mid-stream continuation
// checkable: an answer continued on a standby must equal, byte for byte,
// the answer the primary would have given.
//
// Every token is one word with a leading space (" river"), so the token
// count of a text is its count of whitespace-separated words, and counts
// add: tokens(prompt + delivered) = tokens(prompt) + tokens(delivered). An
// end-of-text token ends an answer early (finish_reason "stop"), about one
// in 48 draws; otherwise it ends at max_tokens ("length").
//
// Chat messages are rendered as "<|role|>\ncontent\n" each, then
// "<|assistant|>\n" for the answer (add_generation_prompt). With vLLM's
// continue_final_message the last message, an assistant prefix, is left open
// instead ("<|assistant|>\nprefix") and the answer continues it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::worker {

inline constexpr const char* kLlmModelName = "gpuha-tiny";
inline constexpr int kLlmDefaultMaxTokens = 64;
inline constexpr int kLlmMaxTokens = 4096;
inline constexpr size_t kLlmMaxPromptBytes = 1 << 20;

// Generates token by token from a text. O(1) per token: FNV-1a is a
// running hash, so the text itself is not kept.
class TinyLm {
 public:
  explicit TinyLm(std::string_view context);
  struct Token {
    std::string_view text;  // " word"; empty at the end of text
    bool end = false;
  };
  Token Next();

 private:
  uint64_t h_;
};

// Whitespace-separated words: the model's token count.
int CountTokens(std::string_view text);

enum class LlmApi { kCompletions, kChat };

// One request, checked. Errors name the field, as OpenAI's do.
struct LlmRequest {
  LlmApi api = LlmApi::kCompletions;
  std::string model;
  std::string prompt;  // rendered (chat messages included)
  int max_tokens = kLlmDefaultMaxTokens;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};
[[nodiscard]] absl::StatusOr<LlmRequest> ParseLlmRequest(LlmApi api, std::string_view body);

// The whole answer, as the worker would stream it: for clients to check.
struct LlmAnswer {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
LlmAnswer Complete(const LlmRequest& r);

// The JSON of one streamed chunk (without "data: "): the token `text`, and
// the finish reason on the last one. For chat, `role_only` makes the first
// chunk, {"delta":{"role":"assistant","content":""}}.
std::string LlmChunkJson(LlmApi api, const std::string& id, int64_t created,
                         const std::string& model, std::string_view text,
                         std::optional<std::string_view> finish_reason, bool role_only = false);
// The usage chunk sent last when stream_options.include_usage is set.
std::string LlmUsageChunkJson(LlmApi api, const std::string& id, int64_t created,
                              const std::string& model, int prompt_tokens, int completion_tokens);
// The whole answer when stream is false.
std::string LlmResponseJson(LlmApi api, const std::string& id, int64_t created,
                            const std::string& model, const LlmAnswer& a);
// GET /v1/models
std::string LlmModelsJson();
// {"error":{"message":...,"type":...,"param":...,"code":...}}, OpenAI's form.
std::string LlmErrorJson(int status, std::string_view message, std::string_view param = "");

// For clients: what a streamed answer (an SSE body) says. Errors name the
// event that is wrong: not JSON, no choices, text after the end, no [DONE],
// or an SSE error event (whose message is returned).
struct StreamedAnswer {
  std::string text;
  std::string finish_reason;
  std::optional<int> prompt_tokens, completion_tokens;  // from a usage chunk
  std::vector<std::string> ids;                         // distinct chunk ids, in order
  int chunks = 0;                                       // data events with text
};
[[nodiscard]] absl::StatusOr<StreamedAnswer> ParseStreamedAnswer(LlmApi api, std::string_view sse);

}  // namespace gpuha::worker
