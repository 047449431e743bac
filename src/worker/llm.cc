#include "worker/llm.h"

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/json_depth.h"
#include "common/sse.h"

namespace gpuha::worker {

using nlohmann::json;

namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t Fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= kFnvPrime;
  }
  return h;
}

// 64 words, each with its leading space: a token.
constexpr std::array<std::string_view, 64> kVocab = {
    " the",     " GPU",    " node",    " stream", " river",   " light",   " keeps",   " serving",
    " while",   " a",      " standby", " waits",  " for",     " its",     " turn",    " and",
    " every",   " token",  " arrives", " in",     " order",   " across",  " quiet",   " racks",
    " of",      " warm",   " silicon", " where",  " memory",  " holds",   " one",     " more",
    " answer",  " than",   " before",  " so",     " nothing", " is",      " lost",    " when",
    " links",   " fail",   " or",      " fans",   " slow",    " down",    " through", " night",
    " engines", " hum",    " above",   " cold",   " aisles",  " bright",  " signals", " travel",
    " far",     " beyond", " each",    " fence",  " clear",   " morning", " data",    " flows"};

// SplitMix64's finaliser: the low bits of FNV-1a alone are poorly mixed.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

absl::Status Bad(absl::string_view param, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", what));
}

const char* ObjectOf(LlmApi api, bool chunk) {
  if (api == LlmApi::kChat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

}  // namespace

TinyLm::TinyLm(std::string_view context) : h_(Fnv(kFnvOffset, context)) {}

namespace {

uint64_t FnvId(uint64_t h, int id) {
  for (int i = 0; i < 4; ++i) {
    h ^= static_cast<uint64_t>(id >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

constexpr size_t kBpeMaxPiece = 64;

}  // namespace

const Bpe& Bpe::Get() {
  static const Bpe* const bpe = new Bpe();
  return *bpe;
}

Bpe::Bpe() {
  for (int b = 0; b < 256; ++b) tokens_.emplace_back(1, static_cast<char>(b));
  std::vector<std::vector<int>> corpus;
  for (std::string_view w : kVocab) {
    std::vector<int> ids;
    for (unsigned char c : w) ids.push_back(c);
    corpus.push_back(std::move(ids));
  }
  for (;;) {
    std::map<std::pair<int, int>, int> count;
    for (const std::vector<int>& w : corpus) {
      for (size_t i = 0; i + 1 < w.size(); ++i) ++count[{w[i], w[i + 1]}];
    }
    if (count.empty()) break;   // every word is one token
    auto best = count.begin();  // the most frequent; ties to the lowest pair
    for (auto it = count.begin(); it != count.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [a, b] = best->first;
    const int id = size();
    tokens_.push_back(tokens_[static_cast<size_t>(a)] + tokens_[static_cast<size_t>(b)]);
    merges_.push_back({best->first, id});
    for (std::vector<int>& w : corpus) {
      std::vector<int> merged;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(w[i]);
        }
      }
      w = std::move(merged);
    }
  }
  std::sort(merges_.begin(), merges_.end());
  for (const std::vector<int>& w : corpus) words_.push_back(w[0]);
  for (int id = 256; id < size(); ++id) {
    if (std::find(words_.begin(), words_.end(), id) == words_.end()) pieces_.push_back(id);
  }
}

void Bpe::EncodePiece(std::string_view piece, std::vector<int>* out) const {
  std::vector<int> ids;
  for (unsigned char c : piece) ids.push_back(c);
  for (;;) {
    // The earliest merge (lowest ID) among the adjacent pairs.
    int best = -1;
    std::pair<int, int> pair;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const std::pair<int, int> p(ids[i], ids[i + 1]);
      auto it = std::lower_bound(merges_.begin(), merges_.end(), std::make_pair(p, 0));
      if (it != merges_.end() && it->first == p && (best < 0 || it->second < best)) {
        best = it->second;
        pair = p;
      }
    }
    if (best < 0) break;
    std::vector<int> merged;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + 1 < ids.size() && ids[i] == pair.first && ids[i + 1] == pair.second) {
        merged.push_back(best);
        ++i;
      } else {
        merged.push_back(ids[i]);
      }
    }
    ids = std::move(merged);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

std::vector<int> Bpe::Encode(std::string_view text) const {
  std::vector<int> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i + 1;  // a piece: a space or not, then up to the next space
    while (j < text.size() && text[j] != ' ' && j - i < kBpeMaxPiece) ++j;
    EncodePiece(text.substr(i, j - i), &out);
    i = j;
  }
  return out;
}

std::string Bpe::Decode(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) out.append(Text(id));
  return out;
}

BpeLm::BpeLm(const std::vector<int>& context) : h_(kFnvOffset) {
  for (int id : context) h_ = FnvId(h_, id);
}

BpeLm::Token BpeLm::Next() {
  const Bpe& bpe = Bpe::Get();
  uint64_t m = Mix(h_);
  if (m % 48 == 0) return {-1, "", true};
  const std::vector<int>& from = (m >> 8) % 4 == 0 ? bpe.pieces() : bpe.words();
  const int id = from[(m >> 16) % from.size()];
  h_ = FnvId(h_, id);
  return {id, bpe.Text(id), false};
}

LlmGenerator::LlmGenerator(const LlmRequest& r)
    : structured_(r.structured), max_tokens_(r.max_tokens) {
  if (r.model == kLlmBpeModelName) {
    prompt_ids_ = r.prompt_ids ? *r.prompt_ids : Bpe::Get().Encode(r.prompt);
    prompt_tokens_ = static_cast<int>(prompt_ids_.size());
    bpe_.emplace(prompt_ids_);
  } else {
    prompt_tokens_ = CountTokens(r.prompt);
    tiny_.emplace(r.prompt);
  }
  if (structured_) {
    open_ = Forced(kLlmJsonOpen);
    close_ = Forced(kLlmJsonClose);
  }
}

std::vector<LlmGenerator::Step> LlmGenerator::Forced(std::string_view text) const {
  if (!bpe_) return {{text, -1, false}};
  std::vector<Step> steps;
  for (int id : Bpe::Get().Encode(text)) steps.push_back({Bpe::Get().Text(id), id, false});
  return steps;
}

LlmGenerator::Step LlmGenerator::Model() {
  if (bpe_) {
    BpeLm::Token t = bpe_->Next();
    return {t.text, t.id, t.end};
  }
  TinyLm::Token t = tiny_->Next();
  return {t.text, -1, t.end};
}

LlmGenerator::Step LlmGenerator::Next() {
  if (!structured_) return Model();
  Step s{"", -1, true};
  if (part_ == Part::kOpen) {
    if (at_ < open_.size()) {
      s = open_[at_++];
    } else {
      part_ = Part::kBody;
    }
  }
  if (part_ == Part::kBody) {
    // The closing, and the end token after it, must still fit.
    const bool room = max_tokens_ - given_ > static_cast<int>(close_.size()) + 1;
    if (room) s = Model();
    if (!room || s.end) {
      part_ = Part::kClose;
      at_ = 0;
    }
  }
  if (part_ == Part::kClose) {
    if (at_ < close_.size()) {
      s = close_[at_++];
    } else {
      part_ = Part::kDone;
    }
  }
  if (part_ == Part::kDone) s = {"", -1, true};
  if (!s.end) ++given_;
  return s;
}

TinyLm::Token TinyLm::Next() {
  uint64_t m = Mix(h_);
  if (m % 48 == 0) return {"", true};
  std::string_view t = kVocab[(m >> 8) % kVocab.size()];
  h_ = Fnv(h_, t);
  return {t, false};
}

int CountTokens(std::string_view text) {
  int n = 0;
  bool in_word = false;
  for (char c : text) {
    bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

absl::StatusOr<LlmRequest> ParseLlmRequest(LlmApi api, std::string_view body) {
  if (!common::JsonDepthWithin(body, common::kMaxJsonDepth)) {
    return Bad("body", absl::StrCat("JSON nested deeper than ", common::kMaxJsonDepth));
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("body", "not JSON");
  if (!j.is_object()) return Bad("body", "not a JSON object");
  LlmRequest r;
  r.api = api;
  auto model = j.find("model");
  if (model == j.end() || !model->is_string()) return Bad("model", "required, a string");
  r.model = model->get<std::string>();
  if (auto mt = j.find("max_tokens"); mt != j.end() && !mt->is_null()) {
    if (!mt->is_number_integer() || *mt < 1 || *mt > kLlmMaxTokens) {
      return Bad("max_tokens", absl::StrCat("must be an integer from 1 to ", kLlmMaxTokens));
    }
    r.max_tokens = mt->get<int>();
  }
  if (auto s = j.find("stream"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return Bad("stream", "must be true or false");
    r.stream = s->get<bool>();
  }
  if (auto so = j.find("stream_options"); so != j.end() && !so->is_null()) {
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    if (auto iu = so->find("include_usage"); iu != so->end()) {
      if (!iu->is_boolean()) return Bad("stream_options.include_usage", "must be true or false");
      r.include_usage = iu->get<bool>();
    }
  }
  if (auto n = j.find("n"); n != j.end() && !n->is_null() && *n != 1) {
    return Bad("n", "only 1 is served");
  }
  if (auto rf = j.find("response_format"); rf != j.end() && !rf->is_null()) {
    auto type = rf->is_object() ? rf->find("type") : rf->end();
    if (type == rf->end() || !type->is_string()) {
      return Bad("response_format.type", "required, a string");
    }
    const std::string& t = type->get_ref<const std::string&>();
    if (t != "text" && t != "json_object" && t != "json_schema") {
      return Bad("response_format.type",
                 absl::StrCat("'", t, "' is not text, json_object or json_schema"));
    }
    r.structured = t != "text";
  }
  if (auto g = j.find("guided_json"); g != j.end() && !g->is_null()) r.structured = true;
  if (auto ri = j.find("return_token_ids"); ri != j.end() && !ri->is_null()) {
    if (!ri->is_boolean()) return Bad("return_token_ids", "must be true or false");
    r.return_token_ids = ri->get<bool>();
  }
  if (api == LlmApi::kCompletions) {
    auto p = j.find("prompt");
    if (p != j.end() && p->is_array()) {
      // A prompt of token IDs, as vLLM takes it: only a model with a
      // tokenizer has IDs.
      if (r.model != kLlmBpeModelName) {
        return Bad("prompt", absl::StrCat("token IDs need the model ", kLlmBpeModelName, " (",
                                          r.model, " has no tokenizer)"));
      }
      if (p->empty() || p->size() > kLlmMaxPromptBytes) {
        return Bad("prompt", absl::StrCat("1 to ", kLlmMaxPromptBytes, " token IDs"));
      }
      const int vocab = Bpe::Get().size();
      std::vector<int> ids;
      ids.reserve(p->size());
      for (size_t i = 0; i < p->size(); ++i) {
        const json& id = (*p)[i];
        if (!id.is_number_integer() || id < 0 || id >= vocab) {
          return Bad(absl::StrCat("prompt[", i, "]"),
                     absl::StrCat("not a token ID (an integer from 0 to ", vocab - 1, ")"));
        }
        ids.push_back(id.get<int>());
      }
      r.prompt_ids = std::move(ids);
      return r;
    }
    if (p == j.end() || !p->is_string()) return Bad("prompt", "required, a string");
    r.prompt = p->get<std::string>();
  } else {
    auto m = j.find("messages");
    if (m == j.end() || !m->is_array() || m->empty()) {
      return Bad("messages", "required, a non-empty array");
    }
    bool cont = false, gen = true;
    if (auto c = j.find("continue_final_message"); c != j.end() && !c->is_null()) {
      if (!c->is_boolean()) return Bad("continue_final_message", "must be true or false");
      cont = c->get<bool>();
    }
    if (auto g = j.find("add_generation_prompt"); g != j.end() && !g->is_null()) {
      if (!g->is_boolean()) return Bad("add_generation_prompt", "must be true or false");
      gen = g->get<bool>();
    }
    if (cont && gen && j.contains("add_generation_prompt")) {
      return Bad("continue_final_message", "cannot be set with add_generation_prompt");
    }
    if (cont) gen = false;
    for (size_t i = 0; i < m->size(); ++i) {
      const json& msg = (*m)[i];
      std::string at = absl::StrCat("messages[", i, "]");
      if (!msg.is_object()) return Bad(at, "must be an object");
      auto role = msg.find("role");
      if (role == msg.end() || !role->is_string()) return Bad(at + ".role", "required, a string");
      const std::string rs = role->get<std::string>();
      if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer") {
        return Bad(at + ".role",
                   absl::StrCat("'", rs, "' is not system, developer, user or assistant"));
      }
      auto content = msg.find("content");
      if (content == msg.end() || !content->is_string()) {
        return Bad(at + ".content", "required, a string");
      }
      bool last = i + 1 == m->size();
      if (last && cont && rs != "assistant") {
        return Bad("continue_final_message", "the last message must be the assistant's");
      }
      absl::StrAppend(&r.prompt, "<|", rs, "|>\n", content->get<std::string>(),
                      last && cont ? "" : "\n");
    }
    if (gen) r.prompt += "<|assistant|>\n";
  }
  if (r.prompt.size() > kLlmMaxPromptBytes) {
    return Bad(api == LlmApi::kChat ? "messages" : "prompt",
               absl::StrCat("over ", kLlmMaxPromptBytes, " bytes"));
  }
  return r;
}

std::optional<std::string> UnknownOpenAiField(LlmApi api, std::string_view body) {
  static constexpr std::array<std::string_view, 17> kCommon = {"model",
                                                               "stream",
                                                               "stream_options",
                                                               "max_tokens",
                                                               "n",
                                                               "temperature",
                                                               "top_p",
                                                               "seed",
                                                               "stop",
                                                               "response_format",
                                                               "user",
                                                               "logprobs",
                                                               "presence_penalty",
                                                               "frequency_penalty",
                                                               "logit_bias",
                                                               "top_logprobs",
                                                               "service_tier"};
  static constexpr std::array<std::string_view, 4> kCompletions = {"prompt", "echo", "best_of",
                                                                   "suffix"};
  static constexpr std::array<std::string_view, 6> kChat = {
      "messages",    "max_completion_tokens", "tools",
      "tool_choice", "parallel_tool_calls",   "reasoning_effort"};
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;  // ParseLlmRequest names what is wrong
  auto known = [&](const std::string& k) {
    auto in = [&](auto& list) { return std::find(list.begin(), list.end(), k) != list.end(); };
    return in(kCommon) || (api == LlmApi::kCompletions ? in(kCompletions) : in(kChat));
  };
  for (const auto& [k, v] : j.items()) {
    if (!known(k)) return absl::StrCat("Unrecognized request argument supplied: ", k);
  }
  return std::nullopt;
}

LlmAnswer Complete(const LlmRequest& r) {
  LlmAnswer a;
  LlmGenerator lm(r);
  a.prompt_tokens = lm.prompt_tokens();
  a.prompt_token_ids = lm.prompt_ids();
  a.finish_reason = "length";
  for (int i = 0; i < r.max_tokens; ++i) {
    LlmGenerator::Step t = lm.Next();
    if (t.end) {
      a.finish_reason = "stop";
      break;
    }
    a.text.append(t.text);
    if (lm.has_ids()) a.token_ids.push_back(t.id);
    ++a.completion_tokens;
  }
  return a;
}

std::string LlmChunkJson(LlmApi api, const std::string& id, int64_t created,
                         const std::string& model, std::string_view text,
                         std::optional<std::string_view> finish_reason, bool role_only,
                         const std::optional<ChunkIds>& ids) {
  json choice = {{"index", 0}};
  if (api == LlmApi::kChat) {
    choice["delta"] = role_only ? json{{"role", "assistant"}, {"content", ""}}
                                : json{{"content", std::string(text)}};
  } else {
    choice["text"] = std::string(text);
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason ? json(std::string(*finish_reason)) : json(nullptr);
  if (ids) {
    choice["token_ids"] = ids->token_id ? json::array({*ids->token_id}) : json::array();
    if (ids->prompt_ids != nullptr && api == LlmApi::kCompletions) {
      choice["prompt_token_ids"] = *ids->prompt_ids;
    }
  }
  json chunk = {{"id", id},
                {"object", ObjectOf(api, true)},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})}};
  if (ids && ids->prompt_ids != nullptr && api == LlmApi::kChat) {
    chunk["prompt_token_ids"] = *ids->prompt_ids;
  }
  return chunk.dump();
}

std::string LlmUsageChunkJson(LlmApi api, const std::string& id, int64_t created,
                              const std::string& model, int prompt_tokens, int completion_tokens) {
  return json{{"id", id},
              {"object", ObjectOf(api, true)},
              {"created", created},
              {"model", model},
              {"choices", json::array()},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}}}}
      .dump();
}

std::string LlmResponseJson(LlmApi api, const std::string& id, int64_t created,
                            const std::string& model, const LlmAnswer& a, bool with_ids) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", a.finish_reason}};
  if (api == LlmApi::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", a.text}};
  } else {
    choice["text"] = a.text;
  }
  if (with_ids) {
    choice["token_ids"] = a.token_ids;
    if (api == LlmApi::kCompletions) choice["prompt_token_ids"] = a.prompt_token_ids;
  }
  json r = {{"id", id},
            {"object", ObjectOf(api, false)},
            {"created", created},
            {"model", model},
            {"choices", json::array({choice})},
            {"usage",
             {{"prompt_tokens", a.prompt_tokens},
              {"completion_tokens", a.completion_tokens},
              {"total_tokens", a.prompt_tokens + a.completion_tokens}}}};
  if (with_ids && api == LlmApi::kChat) r["prompt_token_ids"] = a.prompt_token_ids;
  return r.dump();
}

std::string LlmModelsJson() {
  json data = json::array();
  for (const char* m : {kLlmModelName, kLlmBpeModelName}) {
    data.push_back({{"id", m},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "gpuha"},
                    {"max_model_len", kLlmMaxTokens}});
  }
  return json{{"object", "list"}, {"data", std::move(data)}}.dump();
}

std::string LlmErrorJson(int status, std::string_view message, std::string_view param) {
  const char* type = status == 404   ? "NotFoundError"
                     : status == 400 ? "BadRequestError"
                     : status == 503 ? "ServiceUnavailableError"
                                     : "InternalServerError";
  return json{{"error",
               {{"message", std::string(message)},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(std::string(param))},
                {"code", status}}}}
      .dump();
}

absl::StatusOr<StreamedAnswer> ParseStreamedAnswer(LlmApi api, std::string_view sse) {
  StreamedAnswer out;
  common::SseSplitter split(sse.size() + 1);
  absl::Status status;
  bool done = false;
  int n = 0;
  split.Feed(sse, [&](std::string_view raw) {
    ++n;
    if (!status.ok()) return;
    common::SseEvent e = common::ParseSseEvent(raw);
    if (e.comment_only) return;
    if (e.event == "error") {
      json j = json::parse(e.data, nullptr, false);
      std::string msg = e.data;
      if (!j.is_discarded() && j.contains("error") && j["error"].contains("message") &&
          j["error"]["message"].is_string()) {
        msg = j["error"]["message"].get<std::string>();
      }
      status = absl::UnavailableError(absl::StrCat("event ", n, ": an error event: ", msg));
      return;
    }
    if (done) {
      status = absl::DataLossError(absl::StrCat("event ", n, ": after [DONE]"));
      return;
    }
    if (e.data == "[DONE]") {
      done = true;
      return;
    }
    json j = json::parse(e.data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      status = absl::DataLossError(absl::StrCat("event ", n, ": data is not a JSON object"));
      return;
    }
    if (auto id = j.find("id"); id != j.end() && id->is_string()) {
      if (out.ids.empty() || out.ids.back() != id->get<std::string>()) {
        out.ids.push_back(id->get<std::string>());
      }
    }
    if (auto c = j.find("gpuha_continuation"); c != j.end()) {
      ++out.continued;
      if (auto by = j.find("gpuha_continued_by"); by != j.end() && by->is_string()) {
        out.continued_by = by->get<std::string>();
      }
    }
    auto read_ids = [](const json& at, const char* key, std::vector<int>* ids) {
      auto it = at.find(key);
      if (it == at.end() || !it->is_array()) return false;
      for (const json& id : *it) ids->push_back(id.is_number_integer() ? id.get<int>() : -1);
      return true;
    };
    if (std::vector<int> p; read_ids(j, "prompt_token_ids", &p)) out.prompt_token_ids = p;
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      // Whatever the server sent: a wrong type reads as -1, never a throw.
      auto count = [&](const char* key) {
        auto it = u->find(key);
        return it != u->end() && it->is_number_integer() ? it->get<int>() : -1;
      };
      out.prompt_tokens = count("prompt_tokens");
      out.completion_tokens = count("completion_tokens");
    }
    auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array()) {
      status = absl::DataLossError(absl::StrCat("event ", n, ": no choices array"));
      return;
    }
    for (const json& c : *choices) {
      const json* text = nullptr;
      if (api == LlmApi::kChat) {
        if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
          if (auto ct = d->find("content"); ct != d->end() && ct->is_string()) text = &*ct;
        }
      } else if (auto t = c.find("text"); t != c.end() && t->is_string()) {
        text = &*t;
      }
      if (text != nullptr && !text->get_ref<const std::string&>().empty()) {
        if (!out.finish_reason.empty()) {
          status = absl::DataLossError(absl::StrCat("event ", n, ": text after the finish reason"));
          return;
        }
        out.text += text->get_ref<const std::string&>();
        ++out.chunks;
      }
      if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) {
        out.finish_reason = f->get<std::string>();
      }
      if (std::vector<int> p; read_ids(c, "prompt_token_ids", &p)) out.prompt_token_ids = p;
      read_ids(c, "token_ids", &out.token_ids);
    }
  });
  if (!status.ok()) return status;
  if (split.pending() > 0) {
    return absl::DataLossError(
        absl::StrCat("the stream ends inside an event, after ", n, " events"));
  }
  if (!done) return absl::DataLossError(absl::StrCat("no [DONE] after ", n, " events (cut)"));
  return out;
}

}  // namespace gpuha::worker
