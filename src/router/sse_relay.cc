#include "router/sse_relay.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/json_depth.h"

namespace gpuha::router {

using nlohmann::json;

namespace {

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool PositiveInt(const json& j) { return j.is_number_integer() && j.get<int64_t>() >= 1; }

// What is at `key`, if it is an integer; nullopt otherwise. The JSON comes
// from an upstream or a client: nothing here may throw on a wrong type
// (nlohmann's value() does).
std::optional<int64_t> IntAt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}
bool IsTrue(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && *it == true;
}
bool StringIs(const json& j, const char* key, std::string_view want) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() && it->get_ref<const std::string&>() == want;
}

// The tighter of a request's limits (a chat may give both).
std::optional<int64_t> MaxTokens(const json& body) {
  std::optional<int64_t> limit;
  for (const char* f : {"max_tokens", "max_completion_tokens"}) {
    if (std::optional<int64_t> m = IntAt(body, f)) limit = std::min(limit.value_or(*m), *m);
  }
  return limit;
}

// A chat request as a completion on token IDs (its prompt is set by the
// caller): everything but what belongs to chat (the messages and their
// template, tools, chat's logprobs), and its limit as max_tokens.
json ChatAsCompletion(const json& chat) {
  json b = chat;
  for (const char* f :
       {"messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
        "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
        "documents", "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens",
        "response_format", "reasoning_effort", "add_special_tokens"}) {
    b.erase(f);
  }
  if (std::optional<int64_t> limit = MaxTokens(chat)) b["max_tokens"] = *limit;
  return b;
}

// Token IDs a continuation can send back: whole numbers an int32 holds.
bool IsTokenId(const json& id) {
  return id.is_number_integer() && id >= 0 && id <= std::numeric_limits<int32_t>::max();
}

void AppendEvent(const std::string& event, const json& j, std::string* out) {
  absl::StrAppend(out, event.empty() ? "" : absl::StrCat("event: ", event, "\n"), "data: ", Dump(j),
                  "\n\n");
}

}  // namespace

std::string CompletionsRouteFor(const LlmConfig& c, const LlmRoute& chat) {
  constexpr std::string_view kChat = "chat/completions";
  std::string sibling;
  if (chat.path.ends_with(kChat)) {
    sibling = chat.path.substr(0, chat.path.size() - kChat.size()) + "completions";
  }
  const LlmRoute* only = nullptr;
  int completions = 0;
  for (const LlmRoute& r : c.routes) {
    if (r.api != LlmApi::kCompletions) continue;
    if (r.path == sibling) return r.path;
    only = &r;
    ++completions;
  }
  return completions == 1 ? only->path : "";
}

const LlmRoute* FindLlmRoute(const LlmConfig& c, std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  for (const LlmRoute& r : c.routes) {
    if (path == r.path) return &r;
  }
  return nullptr;
}

absl::StatusOr<LlmCall> ReadLlmCall(LlmApi api, std::string_view body) {
  auto no = [](const std::string& why) { return absl::FailedPreconditionError(why); };
  if (!common::JsonDepthWithin(body, common::kMaxJsonDepth)) {
    return no("the request body's JSON nests too deep");
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return no("the request body is not a JSON object");
  auto stream = j.find("stream");
  if (stream == j.end() || *stream != true) return no("the request is not streamed (stream: true)");
  if (auto n = j.find("n"); n != j.end() && !n->is_null() && *n != 1) {
    return no("the request asks for more than one choice (n)");
  }
  if (auto b = j.find("best_of"); b != j.end() && !b->is_null() && *b != 1) {
    return no("the request asks for best_of");
  }
  if (auto e = j.find("echo"); e != j.end() && *e == true) {
    return no("the request echoes its prompt (echo)");
  }
  // Output held to a grammar (a JSON schema, a regex, a choice): a
  // continuation's engine would start the grammar again from its first
  // token, so the client could get a document that is not one. OpenAI's
  // response_format (but "text"), vLLM's guided_* and structured_outputs,
  // llama.cpp's grammar and json_schema.
  if (auto rf = j.find("response_format"); rf != j.end() && !rf->is_null()) {
    const json* type = rf->is_object() && rf->contains("type") ? &(*rf)["type"] : nullptr;
    if (type == nullptr || *type != "text") {
      return no(absl::StrCat("the request holds its output to a format (response_format ",
                             type != nullptr && type->is_string() ? type->get<std::string>() : "?",
                             "), which a continuation would start again"));
    }
  }
  for (const char* f : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                        "structured_outputs", "grammar", "json_schema"}) {
    if (auto g = j.find(f); g != j.end() && !g->is_null()) {
      return no(absl::StrCat("the request holds its output to a grammar (", f,
                             "), which a continuation would start again"));
    }
  }
  for (const char* f : {"max_tokens", "max_completion_tokens"}) {
    if (auto m = j.find(f); m != j.end() && !m->is_null() && !PositiveInt(*m)) {
      return no(absl::StrCat(f, " is not a positive integer"));
    }
  }
  if (api == LlmApi::kCompletions) {
    auto p = j.find("prompt");
    if (p == j.end() || !p->is_string()) return no("the prompt is not one string");
  } else {
    auto m = j.find("messages");
    if (m == j.end() || !m->is_array() || m->empty()) return no("the request has no messages");
    for (const json& msg : *m) {
      if (!msg.is_object()) return no("a message is not an object");
    }
  }
  return LlmCall{api, std::move(j)};
}

SseContinuity::SseContinuity(LlmApi api, std::optional<LlmCall> call, std::string why_not,
                             size_t max_text_bytes, TokenIdContinuation ids)
    : call_api_(api),
      call_(std::move(call)),
      why_not_(std::move(why_not)),
      max_text_bytes_(max_text_bytes),
      ids_opt_(std::move(ids)) {
  if (asked_ids()) {
    client_ids_ = IsTrue(call_->body, "return_token_ids");
    call_->body["return_token_ids"] = true;
  }
}

std::optional<std::string> SseContinuity::UpstreamBody() const {
  if (!added_ids()) return std::nullopt;
  return Dump(call_->body);
}

std::optional<std::string> SseContinuity::StopAskingForIds(std::string why) {
  if (!asked_ids()) return std::nullopt;
  const bool added = !client_ids_;
  if (added) call_->body.erase("return_token_ids");
  ids_opt_.ask = false;
  ids_opt_.off_because = std::move(why);
  if (!added) return std::nullopt;
  return Dump(call_->body);
}

bool SseContinuity::StripTokenIds(json& j) const {
  bool changed = j.erase("prompt_token_ids") > 0;
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array()) {
    for (json& c : *choices) {
      if (!c.is_object()) continue;
      changed = c.erase("prompt_token_ids") > 0 || changed;
      changed = c.erase("token_ids") > 0 || changed;
    }
  }
  return changed;
}

void SseContinuity::RelayUnfollowed(std::string_view raw, const std::string& event,
                                    std::string_view data, std::string* out) const {
  // The router asked for the IDs; the client that did not still must not
  // get them.
  if (asked_ids() && !client_ids_ && common::JsonDepthWithin(data, common::kMaxJsonDepth)) {
    json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && StripTokenIds(j)) return AppendEvent(event, j, out);
  }
  out->append(raw);
}

bool SseContinuity::TakeTokenIds(json& j, json& choice, bool has_text) {
  bool changed = false;
  // The prompt's: beside the choices (vLLM's chat) or in the choice (a
  // completion). Those that come before any of the answer are the client's
  // prompt's; a continuation's after some hold the delivered tokens too.
  const bool fresh = !have_prompt_ids_ && tokens_ == 0 && ids_.empty();
  for (json* at : {&j, &choice}) {
    auto p = at->find("prompt_token_ids");
    if (p == at->end()) continue;
    if (fresh && p->is_array() && !ids_lost_) {
      have_prompt_ids_ = true;
      for (const json& id : *p) {
        if (!IsTokenId(id)) {
          ids_lost_ = "the upstream's prompt_token_ids are not token IDs";
          break;
        }
        prompt_ids_.push_back(id.get<int32_t>());
      }
    }
    if (!client_ids_ || !fresh) {
      at->erase(p);
      changed = true;
    }
  }
  auto t = choice.find("token_ids");
  const bool has_ids = t != choice.end() && t->is_array() && !t->empty();
  if (has_ids) {
    for (const json& id : *t) {
      if (!IsTokenId(id)) {
        ids_lost_ = "a chunk's token_ids are not token IDs";
      } else if (!ids_lost_) {
        ids_.push_back(id.get<int32_t>());
      }
    }
  } else if (has_text && !ids_lost_) {
    ids_lost_ = "the upstream sent text without its token_ids";
  }
  if (t != choice.end() && !client_ids_) {
    choice.erase(t);
    changed = true;
  }
  if (!ids_lost_ && (prompt_ids_.size() + ids_.size()) * sizeof(int32_t) > max_text_bytes_) {
    ids_lost_ =
        absl::StrCat("the prompt's and the answer's token IDs are over llm.max_text_bytes (",
                     max_text_bytes_, " bytes)");
  }
  if (ids_lost_) {
    std::vector<int32_t>().swap(ids_);
    std::vector<int32_t>().swap(prompt_ids_);
  }
  return changed;
}

int SseContinuity::Feed(std::string_view bytes, std::string* out) {
  int tokens = 0;
  if (raw_ || done_) {
    // Relayed as it is; the end is still looked for.
    out->append(bytes);
    if (!done_ && bytes.find("data: [DONE]") != std::string_view::npos) done_ = true;
    return 0;
  }
  if (!split_.Feed(bytes, [&](std::string_view raw) { OnEvent(raw, out, &tokens); })) {
    // An event over the limit: relayed as it is, and no longer followed.
    raw_ = true;
    opaque_ = true;
    why_not_ = "an event of the stream is over 1 MiB";
    out->append(split_.TakePending());
  }
  return tokens;
}

void SseContinuity::OnEvent(std::string_view raw, std::string* out, int* tokens) {
  // After the upstream reported its failure, nothing more of its is taken:
  // the caller continues the answer from what was delivered before.
  if (upstream_error_) return;
  if (done_) {
    out->append(raw);
    return;
  }
  common::SseEvent e = common::ParseSseEvent(raw);
  if (e.comment_only) {
    out->append(raw);
    return;
  }
  if (e.data == "[DONE]") {
    done_ = true;
    out->append(raw);
    return;
  }
  if (opaque_) {  // not followed any more, but its end still counts
    return RelayUnfollowed(raw, e.event, e.data, out);
  }
  auto not_followed = [&](const char* why) {
    opaque_ = true;
    why_not_ = why;
    RelayUnfollowed(raw, e.event, e.data, out);
  };
  if (!common::JsonDepthWithin(e.data, common::kMaxJsonDepth)) {
    return not_followed("an event of the stream nests its JSON too deep");
  }
  json j = json::parse(e.data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return not_followed("an event of the stream is not a JSON completion chunk");
  }
  if (e.event == "error" || (j.contains("error") && !j.contains("choices"))) {
    // The upstream's own report of a failure mid-answer (vLLM sends one
    // when its engine dies): not for the client, whose answer goes on
    // elsewhere. Held here for the caller to fail the upstream.
    const json* msg = nullptr;
    if (auto err = j.find("error"); err != j.end()) {
      msg = err->is_object() && err->contains("message") ? &(*err)["message"] : &*err;
    }
    upstream_error_ = msg != nullptr && msg->is_string() ? msg->get<std::string>() : e.data;
    return;
  }
  std::string piece;
  bool role_only = false;
  bool changed = false;
  // A chat continued on token IDs streams completion chunks: read as
  // such, and rewritten as the chat's.
  const bool as_completion = by_ids_ && call_api_ == LlmApi::kChat;
  auto choices = j.find("choices");
  if (choices != j.end() && choices->is_array() && !choices->empty()) {
    json& c = (*choices)[0];
    if (!c.is_object()) return not_followed("a choice of the stream is not an object");
    if (choices->size() > 1 || IntAt(c, "index").value_or(0) != 0) {
      return not_followed("the stream has more than one choice");
    }
    const json* t = nullptr;
    if (call_api_ == LlmApi::kChat && !as_completion) {
      if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
        // What a continuation by text alone would lose.
        for (const char* f : {"tool_calls", "function_call", "reasoning_content"}) {
          if (d->contains(f) && !(*d)[f].is_null()) {
            return not_followed(
                "the answer has tool calls or reasoning, which a continuation "
                "by text would lose");
          }
        }
        if (auto ct = d->find("content"); ct != d->end() && ct->is_string()) t = &*ct;
        role_only = d->contains("role");
      }
    } else if (auto tt = c.find("text"); tt != c.end() && tt->is_string()) {
      t = &*tt;
    }
    if (t != nullptr) piece = t->get<std::string>();
    auto f = c.find("finish_reason");
    bool finish = f != c.end() && f->is_string();
    if (finish) finished_ = true;
    role_only = role_only && piece.empty() && !finish;
    if (asked_ids()) changed = TakeTokenIds(j, c, !piece.empty());
    if (as_completion) {
      c.erase("text");
      c["delta"] = piece.empty() ? json::object() : json{{"content", piece}};
      c["logprobs"] = nullptr;
    }
  } else if (asked_ids()) {
    json none = json::object();
    changed = TakeTokenIds(j, none, false);
  }
  if (as_completion) j["object"] = "chat.completion.chunk";
  const bool repeated_role = role_only && role_sent_;
  role_sent_ = role_sent_ || role_only;
  if (continuations_ == 0) {
    if (id_.is_null() && j.contains("id")) id_ = j["id"];
    if (created_.is_null() && j.contains("created")) created_ = j["created"];
    if (!piece.empty()) template_ = j;
    if (changed) {
      AppendEvent(e.event, j, out);
    } else {
      out->append(raw);
    }
  } else {
    // The continuation's second role chunk (the first, if the client never
    // got the first upstream's, is relayed).
    if (repeated_role && !j.contains("usage")) return;
    if (!id_.is_null()) j["id"] = id_;
    if (!created_.is_null()) j["created"] = created_;
    // What came from a continuation says so: with sampling the rest is a
    // different, valid text, and a client may want to know it was spliced
    // (a field clients that do not know it ignore).
    j["gpuha_continuation"] = continuations_;
    j["gpuha_continued_by"] = restart_ ? "restart" : by_ids_ ? "token_ids" : "text";
    // The continuation's prompt held the tokens already sent: they are the
    // answer's, not the prompt's. Only counts that are whole numbers and
    // hold those tokens are moved; other usage is relayed as it came (an
    // adversarial upstream's "prompt_tokens": "x" once became -3).
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      std::optional<int64_t> prompt = IntAt(*u, "prompt_tokens");
      std::optional<int64_t> completion = IntAt(*u, "completion_tokens");
      if (prompt && completion && *prompt >= base_tokens_ && *completion >= 0) {
        const int64_t p = *prompt - base_tokens_;
        const int64_t c = *completion + base_tokens_;
        (*u)["prompt_tokens"] = p;
        (*u)["completion_tokens"] = c;
        (*u)["total_tokens"] = p + c;
      }
    }
    AppendEvent(e.event, j, out);
    if (!piece.empty()) template_ = std::move(j);
  }
  if (!piece.empty()) {
    ++*tokens;
    ++tokens_;
    if (!text_over_ && text_.size() + piece.size() > max_text_bytes_) {
      text_over_ = true;
      std::string().swap(text_);
    }
    if (!text_over_) text_ += piece;
  }
}

int64_t SseContinuity::Delivered() const {
  // The token IDs count exactly where an upstream batches tokens in a chunk.
  return std::max<int64_t>(tokens_, static_cast<int64_t>(ids_.size()));
}

std::optional<int64_t> SseContinuity::Remaining() const {
  if (!call_) return std::nullopt;
  std::optional<int64_t> limit = MaxTokens(call_->body);
  if (!limit && call_->api == LlmApi::kCompletions) limit = kCompletionsDefaultMaxTokens;
  if (!limit) return std::nullopt;
  return *limit - Delivered();
}

std::optional<std::string> SseContinuity::CannotContinue() const {
  if (!call_) return why_not_;
  if (opaque_) return why_not_;
  if (text_over_) {
    return absl::StrCat("the answer's text is over llm.max_text_bytes (", max_text_bytes_,
                        " bytes)");
  }
  return std::nullopt;
}

std::optional<std::string> SseContinuity::OnlyTheEndIsMissing() const {
  if (done_) return std::nullopt;
  if (finished_) return std::string("data: [DONE]\n\n");
  std::optional<int64_t> left = Remaining();
  if (!left || *left > 0 || template_.is_null()) return std::nullopt;
  json last = template_;
  last.erase("usage");
  if (!id_.is_null()) last["id"] = id_;
  json& c = last["choices"][0];
  if (call_api_ == LlmApi::kChat) {
    c["delta"] = json::object();
  } else {
    c["text"] = "";
  }
  c["finish_reason"] = "length";
  return absl::StrCat("data: ", Dump(last), "\n\ndata: [DONE]\n\n");
}

std::optional<std::string> SseContinuity::WhyNotByIds() const {
  if (!asked_ids()) return ids_opt_.off_because;
  if (ids_lost_) return ids_lost_;
  if (!have_prompt_ids_ || prompt_ids_.empty()) return "the upstream gave no prompt_token_ids";
  const json& body = call_->body;
  // vLLM holds back the text that might begin a stop string, but not its
  // tokens' IDs: on the IDs, that text would never reach the client.
  if (auto stop = body.find("stop");
      stop != body.end() && !stop->is_null() && !(stop->is_array() && stop->empty()) &&
      !(stop->is_string() && stop->get_ref<const std::string&>().empty()) &&
      !IsTrue(body, "include_stop_str_in_output")) {
    return "the request has stop strings, whose held-back text is not in the delivered text";
  }
  if (call_->api == LlmApi::kCompletions) return std::nullopt;
  if (ids_opt_.completions_path.empty()) {
    return "no completions route in llm.routes to continue a chat on its token IDs";
  }
  if (auto tools = body.find("tools"); tools != body.end() && tools->is_array() &&
                                       !tools->empty() && !StringIs(body, "tool_choice", "none")) {
    return "the chat offers tools, whose calls a completions route would not parse";
  }
  if (IsTrue(body, "logprobs")) {
    return "the chat asks for logprobs, which a completions route gives in another shape";
  }
  if (!MaxTokens(body)) {
    return "the chat gives no max_tokens, which a completions route would take as 16";
  }
  return std::nullopt;
}

std::string SseContinuity::BeginContinuation() {
  const int64_t delivered = Delivered();
  // Nothing of the answer reached the client: the request again, as it was.
  restart_ = delivered == 0;
  text_because_ = restart_ ? std::nullopt : WhyNotByIds();
  by_ids_ = !restart_ && !text_because_;
  continuation_path_.clear();
  base_tokens_ = static_cast<int>(delivered);
  ++continuations_;
  upstream_error_.reset();
  split_ = common::SseSplitter();  // the broken stream's partial event is dropped
  json b = call_->body;
  if (restart_) return Dump(b);
  if (by_ids_) {
    json prompt = prompt_ids_;
    for (int32_t id : ids_) prompt.push_back(id);
    if (call_->api == LlmApi::kChat) {
      b = ChatAsCompletion(call_->body);
      continuation_path_ = ids_opt_.completions_path;
    }
    b["prompt"] = std::move(prompt);
    b["return_token_ids"] = true;
  } else if (call_->api == LlmApi::kCompletions) {
    b["prompt"] = b["prompt"].get<std::string>() + text_;
  } else {
    json& msgs = b["messages"];
    json& last = msgs.back();
    if (IsTrue(b, "continue_final_message") && StringIs(last, "role", "assistant") &&
        last.contains("content") && last["content"].is_string()) {
      last["content"] = last["content"].get<std::string>() + text_;
    } else {
      msgs.push_back({{"role", "assistant"}, {"content", text_}});
    }
    b["continue_final_message"] = true;
    b["add_generation_prompt"] = false;
  }
  bool limited = false;
  for (const char* f : {"max_tokens", "max_completion_tokens"}) {
    if (auto m = b.find(f); m != b.end() && m->is_number_integer()) {
      *m = m->get<int64_t>() - delivered;
      limited = true;
    }
  }
  if (!limited && call_->api == LlmApi::kCompletions) {
    b["max_tokens"] = kCompletionsDefaultMaxTokens - delivered;
  }
  return Dump(b);
}

std::string SseContinuity::How() const {
  if (restart_) return "from the start (none of the answer was delivered)";
  if (by_ids_) return "on its token IDs";
  return absl::StrCat("by text (", text_because_.value_or(""), ")");
}

std::string SseContinuity::ErrorEvent(std::string_view why) {
  json e = {{"error",
             {{"message", std::string(why)}, {"type", "gpuha_stream_interrupted"}, {"code", 502}}}};
  return absl::StrCat("event: error\ndata: ", Dump(e), "\n\n");
}

}  // namespace gpuha::router
