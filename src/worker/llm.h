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
//
// "gpuha-tiny-bpe", the second model, is what a real engine is: text is
// tokenized by byte-level BPE (merges learned over the same 64 words), and
// the next token is a function of the token IDs so far, drawn from whole
// words and from the merges' pieces (" ri", "ver"). A generated " ri"+"ver"
// reads " river", which the tokenizer gives back as one token: continued by
// text, the answer can go another way; continued on the token IDs (a prompt
// of IDs, vLLM's form), it cannot. It serves vLLM's return_token_ids
// (prompt_token_ids and per-chunk token_ids) and token-ID prompts on
// /v1/completions; gpuha-tiny ignores return_token_ids, as an engine
// without it would.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::worker {

inline constexpr const char* kLlmModelName = "gpuha-tiny";
inline constexpr const char* kLlmBpeModelName = "gpuha-tiny-bpe";
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

// Byte-level BPE: IDs 0-255 are bytes, each later ID one merge, learned
// over the 64 words as BPE training does (the most frequent adjacent pair
// first, ties to the lowest IDs) until each word is one token. Text is cut
// into pieces before each space (a piece is at most 64 bytes), and each
// piece merged by rank. Decode(Encode(t)) == t for any bytes.
class Bpe {
 public:
  static const Bpe& Get();
  std::vector<int> Encode(std::string_view text) const;
  std::string Decode(const std::vector<int>& ids) const;
  std::string_view Text(int id) const { return tokens_[static_cast<size_t>(id)]; }
  int size() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int>& words() const { return words_; }    // the 64 words' IDs
  const std::vector<int>& pieces() const { return pieces_; }  // merges that are no word

 private:
  Bpe();
  void EncodePiece(std::string_view piece, std::vector<int>* out) const;
  std::vector<std::string> tokens_;
  std::vector<std::pair<std::pair<int, int>, int>> merges_;  // sorted by pair: (a, b) -> id
  std::vector<int> words_, pieces_;
};

// gpuha-tiny-bpe's generator: the next token a function of the IDs so far
// (three draws in four a word, one a piece; an end about one in 48).
class BpeLm {
 public:
  explicit BpeLm(const std::vector<int>& context);
  struct Token {
    int id = -1;
    std::string_view text;
    bool end = false;
  };
  Token Next();

 private:
  uint64_t h_;
};

enum class LlmApi { kCompletions, kChat };

// One request, checked. Errors name the field, as OpenAI's do.
struct LlmRequest {
  LlmApi api = LlmApi::kCompletions;
  std::string model;
  std::string prompt;  // rendered (chat messages included); empty for a token-ID prompt
  std::optional<std::vector<int>> prompt_ids;  // a completion's prompt given as token IDs
  int max_tokens = kLlmDefaultMaxTokens;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // vLLM's: prompt_token_ids and token_ids in the answer
  // response_format json_object or json_schema, or vLLM's guided_json: the
  // answer is one JSON document (LlmGenerator).
  bool structured = false;
};
[[nodiscard]] absl::StatusOr<LlmRequest> ParseLlmRequest(LlmApi api, std::string_view body);
// As OpenAI's own API does (and a server whose schema forbids extra
// fields): the first field of `body` that is not OpenAI's, named in the
// 400's words ("Unrecognized request argument supplied: return_token_ids");
// nullopt if none.
std::optional<std::string> UnknownOpenAiField(LlmApi api, std::string_view body);

// A structured answer, as an engine held to a grammar gives it:
// {"answer":"<the model's words>"}. The opening and the closing are tokens
// of their own (one each on gpuha-tiny, their bytes' tokens on the BPE
// model), and the closing comes before the end token, or early enough that
// the end token still fits in max_tokens.
inline constexpr std::string_view kLlmJsonOpen = "{\"answer\":\"";
inline constexpr std::string_view kLlmJsonClose = "\"}";

// One answer's tokens, whichever model the request names.
class LlmGenerator {
 public:
  explicit LlmGenerator(const LlmRequest& r);
  struct Step {
    std::string_view text;
    int id = -1;  // gpuha-tiny-bpe only
    bool end = false;
  };
  Step Next();
  int prompt_tokens() const { return prompt_tokens_; }
  bool has_ids() const { return bpe_.has_value(); }
  const std::vector<int>& prompt_ids() const { return prompt_ids_; }

 private:
  Step Model();
  std::vector<Step> Forced(std::string_view text) const;
  std::optional<TinyLm> tiny_;
  std::optional<BpeLm> bpe_;
  std::vector<int> prompt_ids_;
  int prompt_tokens_ = 0;
  // Structured: the opening's steps, then the model's, then the closing's.
  bool structured_ = false;
  int max_tokens_ = 0;
  int given_ = 0;  // steps given that were tokens
  std::vector<Step> open_, close_;
  size_t at_ = 0;  // into open_, then into close_
  enum class Part { kOpen, kBody, kClose, kDone } part_ = Part::kOpen;
};

// The whole answer, as the worker would stream it: for clients to check.
struct LlmAnswer {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  int prompt_tokens = 0;
  int completion_tokens = 0;
  std::vector<int> prompt_token_ids, token_ids;  // gpuha-tiny-bpe only
};
LlmAnswer Complete(const LlmRequest& r);

// The JSON of one streamed chunk (without "data: "): the token `text`, and
// the finish reason on the last one. For chat, `role_only` makes the first
// chunk, {"delta":{"role":"assistant","content":""}}.
// With return_token_ids, `token_id` goes in the choice's token_ids (none:
// []) and `prompt_ids`, on the answer's first chunk, as vLLM places them: in
// the choice for a completion, beside the choices for chat.
struct ChunkIds {
  std::optional<int> token_id;
  const std::vector<int>* prompt_ids = nullptr;
};
std::string LlmChunkJson(LlmApi api, const std::string& id, int64_t created,
                         const std::string& model, std::string_view text,
                         std::optional<std::string_view> finish_reason, bool role_only = false,
                         const std::optional<ChunkIds>& ids = std::nullopt);
// The usage chunk sent last when stream_options.include_usage is set.
std::string LlmUsageChunkJson(LlmApi api, const std::string& id, int64_t created,
                              const std::string& model, int prompt_tokens, int completion_tokens);
// The whole answer when stream is false.
std::string LlmResponseJson(LlmApi api, const std::string& id, int64_t created,
                            const std::string& model, const LlmAnswer& a, bool with_ids = false);
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
  std::vector<int> token_ids;                           // every chunk's token_ids, in order
  std::optional<std::vector<int>> prompt_token_ids;
  int continued = 0;         // chunks marked gpuha_continuation (the router's)
  std::string continued_by;  // their gpuha_continued_by: "token_ids" or "text"
};
[[nodiscard]] absl::StatusOr<StreamedAnswer> ParseStreamedAnswer(LlmApi api, std::string_view sse);

}  // namespace gpuha::worker
