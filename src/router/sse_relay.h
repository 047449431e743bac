// SseContinuity: what the router keeps of one LLM token stream (an
// OpenAI-style completion with stream: true, relayed as server-sent events)
// so that, when its upstream fails or stalls mid-answer, the standby can be
// asked for the rest and the client's open stream goes on as one answer.
//
// While relaying, Feed() takes the upstream's body bytes and hands back
// whole events only (a partial event is held, so the client never holds
// half of one), keeping the text delivered and the tokens counted (one per
// chunk with text). On a failure, BeginContinuation() makes the request for
// the standby:
//   completions  the prompt extended by the delivered text;
//   chat         the messages with the delivered text as an assistant
//                prefix, continue_final_message: true and
//                add_generation_prompt: false (vLLM's parameters);
//   both         max_tokens (or max_completion_tokens) less the tokens
//                delivered; a completion that gave none gets OpenAI's
//                default of 16 less the tokens delivered.
// The continuation's events are then rewritten to read as the first
// upstream's: its id and created, no second chat role chunk, and its usage
// with the delivered tokens moved from the prompt back to the completion.
//
// On token IDs (llm.token_ids, on by default): the first request asks the
// upstream for them (vLLM's and SGLang's return_token_ids; what the client
// did not ask for is taken out of the events it is sent), the prompt's IDs
// and each chunk's are kept, and the continuation's prompt is those IDs,
// prompt then delivered, on the completions route: a BPE engine given back
// its text can tokenize it otherwise (" ri"+"ver" reads " river", one
// token) and go another way, even greedy; given its IDs it cannot. A chat
// answer is continued on the completions route too (the chat template is
// in the prompt's IDs) and its events rewritten as chat chunks. Where an
// upstream gave no IDs (every chunk with text must carry them), or a chat
// has no completions route, the continuation is by text, as follows.
// A break before any of the answer reached the client sends the request
// again as it was ("restart"). Continued events carry "gpuha_continuation"
// (the count) and "gpuha_continued_by" ("token_ids", "text" or "restart").
//
// The count of tokens is a count of chunks with text: exact for servers
// that send one token per chunk (vLLM's default, gpuha's worker), an
// undercount for a server that batches tokens into chunks. Sampling with
// temperature makes a continuation a different (equally valid) text; with
// greedy decoding or gpuha's model it is the same text.
//
// When the rest cannot be asked for (not a streamed completion of a known
// shape, continuation off, the text over max_text_bytes, or no upstream
// left), ErrorEvent() ends the stream with an SSE error event that names the
// reason: never a silent cut.
//
// Pure: bytes in, bytes out. Thread-safety: none (one request's).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sse.h"
#include "router/router_config.h"

namespace gpuha::router {

// The LLM route a request's upstream target is on (its path, without the
// query, equals a route's path); null if none.
const LlmRoute* FindLlmRoute(const LlmConfig& c, std::string_view target);

// A request the router may continue: parsed and checked.
struct LlmCall {
  LlmApi api = LlmApi::kCompletions;
  nlohmann::json body;
};
// Not OK (with the reason) for a request whose answer cannot be continued:
// not JSON, not streamed, n > 1, echo, a prompt that is not one string, or
// output held to a format or grammar (response_format json_schema or
// json_object, vLLM's guided_* and structured_outputs, llama.cpp's grammar):
// continued by text, the grammar would start again mid-document.
[[nodiscard]] absl::StatusOr<LlmCall> ReadLlmCall(LlmApi api, std::string_view body);

// The OpenAI default of max_tokens for /v1/completions.
inline constexpr int64_t kCompletionsDefaultMaxTokens = 16;

// Continuation on token IDs: `ask` adds return_token_ids to the request;
// a chat is continued on `completions_path` (none: by text).
struct TokenIdContinuation {
  bool ask = false;
  std::string completions_path;
  std::string off_because = "llm.token_ids is off";  // when not `ask`
};

// A request body over this is continued by text: its prompt's IDs, all in
// the answer's first event, would make that event more than the 1 MiB an
// event may be (about 7 bytes of JSON per ID).
inline constexpr size_t kTokenIdsMaxRequestBytes = 128 << 10;

// The completions route a chat on `chat` is continued on by token IDs: its
// sibling (".../chat/completions" -> ".../completions") if that is a
// completions route, else the only completions route; empty if none.
std::string CompletionsRouteFor(const LlmConfig& c, const LlmRoute& chat);

class SseContinuity {
 public:
  // `call` nullopt: track only, and `why_not` is what the error event says
  // if the stream breaks.
  SseContinuity(LlmApi api, std::optional<LlmCall> call, std::string why_not, size_t max_text_bytes,
                TokenIdContinuation ids = {});

  // The request body to send in place of the client's (it asks for token
  // IDs); nullopt: the client's as it came.
  std::optional<std::string> UpstreamBody() const;
  // The router added return_token_ids to the request (the client had not).
  bool added_ids() const { return asked_ids() && !client_ids_; }
  // An upstream refused the return_token_ids added to the request: from
  // here on it is not asked for, and continuations are by text. The body
  // to send instead (the client's fields; nullopt if none was added).
  std::optional<std::string> StopAskingForIds(std::string why);

  // The upstream's body bytes; whole events are appended to `out`
  // (rewritten during a continuation). Returns the tokens in them.
  int Feed(std::string_view bytes, std::string* out);

  bool done() const { return done_; }  // "data: [DONE]" went to the client
  int tokens() const { return tokens_; }
  const std::string& text() const { return text_; }
  int continuations() const { return continuations_; }
  // The upstream reported a failure in the stream itself (an error event,
  // or a data chunk holding only an error): the caller fails it over.
  // The event is not relayed.
  const std::optional<std::string>& upstream_error() const { return upstream_error_; }

  // Why the rest cannot be asked of another upstream; nullopt: it can.
  std::optional<std::string> CannotContinue() const;
  // Every token was delivered and only the end was lost: the events that
  // close the answer (a finish chunk if none came, and [DONE]). Asking an
  // upstream for nothing would be wrong.
  std::optional<std::string> OnlyTheEndIsMissing() const;
  // The body of the continuation request; from here on Feed() reads the
  // continuation's stream.
  std::string BeginContinuation();
  // Where the continuation begun goes: empty for the request's own target,
  // else the completions route (a chat continued on token IDs).
  const std::string& continuation_path() const { return continuation_path_; }
  bool by_token_ids() const { return by_ids_; }
  // How the continuation begun asks: "on its token IDs" or "by text (why)".
  std::string How() const;
  // "event: error" with an OpenAI-shaped error naming `why`.
  static std::string ErrorEvent(std::string_view why);

 private:
  void OnEvent(std::string_view raw, std::string* out, int* tokens);
  // Keeps the event's token IDs; takes out those the client did not ask
  // for. True if `j` changed.
  bool TakeTokenIds(nlohmann::json& j, nlohmann::json& choice, bool has_text);
  // An event of a stream no longer followed: as it came, but without the
  // token IDs the client did not ask for.
  void RelayUnfollowed(std::string_view raw, const std::string& event, std::string_view data,
                       std::string* out) const;
  bool StripTokenIds(nlohmann::json& j) const;
  bool asked_ids() const { return call_.has_value() && ids_opt_.ask; }
  int64_t Delivered() const;  // tokens delivered: by chunk, or by ID where there are more
  // Why the continuation cannot be on token IDs; nullopt: it can.
  std::optional<std::string> WhyNotByIds() const;
  std::optional<int64_t> Remaining() const;  // max tokens left; nullopt: no limit given

  LlmApi call_api_;
  std::optional<LlmCall> call_;
  std::string why_not_;
  size_t max_text_bytes_;
  common::SseSplitter split_;
  std::string text_;
  int tokens_ = 0;
  bool done_ = false;
  bool finished_ = false;  // a finish_reason was delivered
  bool opaque_ = false;    // not followed (no continuation), but its [DONE] still seen
  bool raw_ = false;       // an event over the limit: the rest is relayed as bytes
  bool text_over_ = false;
  bool role_sent_ = false;  // a chat's role chunk went to the client
  int continuations_ = 0;
  int base_tokens_ = 0;  // delivered before the current continuation
  nlohmann::json id_, created_;
  nlohmann::json template_;  // the last chunk with text: the shape of a made-up finish chunk
  std::optional<std::string> upstream_error_;
  // Token IDs: asked for, and by the client too (then left in its events).
  TokenIdContinuation ids_opt_;
  bool client_ids_ = false;
  bool have_prompt_ids_ = false;
  std::vector<int32_t> prompt_ids_;      // the prompt's, as the first upstream gave them
  std::vector<int32_t> ids_;             // every token delivered, in order
  std::optional<std::string> ids_lost_;  // why ids_ is not the whole answer
  bool restart_ = false;                 // the current continuation asks for the whole answer again
  bool by_ids_ = false;                  // the current continuation is on token IDs
  std::optional<std::string> text_because_;  // why it is by text
  std::string continuation_path_;
};

}  // namespace gpuha::router
