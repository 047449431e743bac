#include "router/sse_relay.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/llm.h"

namespace gpuha::router {
namespace {

using nlohmann::json;

worker::LlmApi W(LlmApi a) {
  return a == LlmApi::kChat ? worker::LlmApi::kChat : worker::LlmApi::kCompletions;
}

// The events gpuha's worker streams for a request body (as a vLLM would),
// with the token IDs where the body asks for them and the model has them.
std::vector<std::string> Stream(LlmApi api, const std::string& body, const std::string& id) {
  auto r = worker::ParseLlmRequest(W(api), body);
  EXPECT_TRUE(r.ok()) << r.status() << " " << body;
  std::vector<std::string> ev;
  auto add = [&](const std::string& d) { ev.push_back(absl::StrCat("data: ", d, "\n\n")); };
  worker::LlmGenerator lm(*r);
  const bool ids = r->return_token_ids && lm.has_ids();
  if (api == LlmApi::kChat) {
    add(worker::LlmChunkJson(
        W(api), id, 7, r->model, "", {}, true,
        ids ? std::optional<worker::ChunkIds>({{}, &lm.prompt_ids()}) : std::nullopt));
  }
  int n = 0;
  for (int i = 0; i < r->max_tokens; ++i) {
    worker::LlmGenerator::Step t = lm.Next();
    bool last = t.end || i + 1 == r->max_tokens;
    if (!t.end) ++n;
    if (!t.end || last) {
      std::optional<worker::ChunkIds> chunk_ids;
      if (ids) {
        chunk_ids =
            worker::ChunkIds{t.end ? std::nullopt : std::optional<int>(t.id),
                             api == LlmApi::kCompletions && i == 0 ? &lm.prompt_ids() : nullptr};
      }
      add(worker::LlmChunkJson(
          W(api), id, 7, r->model, t.text,
          last ? std::optional<std::string_view>(t.end ? "stop" : "length") : std::nullopt, false,
          chunk_ids));
    }
    if (last) break;
  }
  if (r->include_usage) {
    add(worker::LlmUsageChunkJson(W(api), id, 7, r->model, lm.prompt_tokens(), n));
  }
  add("[DONE]");
  return ev;
}

std::string Join(const std::vector<std::string>& v, size_t from = 0, size_t to = ~size_t{0}) {
  std::string s;
  for (size_t i = from; i < v.size() && i < to; ++i) s += v[i];
  return s;
}

SseContinuity Follow(LlmApi api, const std::string& body, size_t max_text = 1 << 20,
                     TokenIdContinuation ids = {}) {
  auto call = ReadLlmCall(api, body);
  EXPECT_TRUE(call.ok()) << call.status();
  return SseContinuity(api, std::move(*call), "", max_text, std::move(ids));
}

// The client's view: the answer the router relays when the first upstream
// breaks after `cut_at` bytes of its stream and the standby gives the rest.
std::string Continued(LlmApi api, const std::string& body, size_t cut_at,
                      TokenIdContinuation ids = {}) {
  SseContinuity sc = Follow(api, body, 1 << 20, std::move(ids));
  const std::string sent = sc.UpstreamBody().value_or(body);
  std::string whole = Join(Stream(api, sent, "first"));
  std::string client;
  sc.Feed(std::string_view(whole).substr(0, cut_at), &client);
  if (sc.done()) return client;
  if (auto end = sc.OnlyTheEndIsMissing()) return client + *end;
  std::string next = sc.BeginContinuation();
  // A chat continued on its token IDs is asked of the completions route.
  const LlmApi next_api = sc.continuation_path().empty() ? api : LlmApi::kCompletions;
  sc.Feed(Join(Stream(next_api, next, "second")), &client);
  EXPECT_TRUE(sc.done());
  return client;
}

TEST(SseRelayTest, ACompletionCutAnywhereIsContinuedToTheUninterruptedAnswer) {
  for (LlmApi api : {LlmApi::kCompletions, LlmApi::kChat}) {
    // The first prompt whose answer is long enough to cut in many places.
    std::string body, whole;
    for (int q = 0; q < 100; ++q) {
      std::string prompt = absl::StrCat("what fails over? ", q);
      body = api == LlmApi::kChat
                 ? absl::StrCat(R"({"model":"gpuha-tiny","stream":true,"max_tokens":40,
                     "stream_options":{"include_usage":true},
                     "messages":[{"role":"user","content":")",
                                prompt, R"("}]})")
                 : absl::StrCat(R"({"model":"gpuha-tiny","stream":true,"max_tokens":40,
                     "stream_options":{"include_usage":true},"prompt":")",
                                prompt, R"("})");
      whole = Join(Stream(api, body, "first"));
      if (worker::ParseStreamedAnswer(W(api), whole)->chunks > 20) break;
    }
    auto want = worker::ParseStreamedAnswer(W(api), whole);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_GT(want->chunks, 20);
    // Every byte position, mid-event included.
    for (size_t cut = 0; cut < whole.size(); cut += 7) {
      std::string client = Continued(api, body, cut);
      auto got = worker::ParseStreamedAnswer(W(api), client);
      ASSERT_TRUE(got.ok()) << got.status() << " at " << cut << "\n" << client;
      EXPECT_EQ(got->text, want->text) << cut;
      EXPECT_EQ(got->finish_reason, want->finish_reason) << cut;
      // The usage, moved back from prompt to completion. Only a cut between
      // the finish chunk and the usage chunk loses it: no upstream can be
      // asked for a usage alone.
      if (cut <= whole.find("finish_reason\":\"") || got->prompt_tokens) {
        EXPECT_EQ(got->prompt_tokens, want->prompt_tokens) << cut;
        EXPECT_EQ(got->completion_tokens, want->completion_tokens) << cut;
      }
      // One id throughout: the first upstream's, once the client saw it.
      ASSERT_EQ(got->ids.size(), 1u) << cut;
      if (cut >= whole.find("\n\n") + 2) {
        EXPECT_EQ(got->ids[0], "first") << cut;
      }
      // One role chunk at most: the continuation's is dropped.
      size_t roles = 0;
      for (size_t at = client.find("\"role\""); at != std::string::npos;
           at = client.find("\"role\"", at + 1)) {
        ++roles;
      }
      EXPECT_LE(roles, 1u) << cut;
      // A continued chunk says so; none of the first upstream's does: what
      // comes before the first marked event is the first upstream's, as it sent it.
      const size_t marked = client.find("\"gpuha_continuation\":1");
      if (marked != std::string::npos) {
        const size_t event = client.rfind("data: ", marked);
        ASSERT_NE(event, std::string::npos);
        EXPECT_EQ(whole.compare(0, event, client, 0, event), 0) << cut;
      }
      EXPECT_EQ(client.find("\"gpuha_continuation\"") == std::string::npos,
                marked == std::string::npos)
          << cut;
    }
  }
}

// On a tokenizer model (gpuha-tiny-bpe), cut anywhere: continued on the
// token IDs, every answer is the uninterrupted one, token for token, for
// chat too (continued on the completions route and rewritten as chat);
// continued by text, some are not. The IDs reach the client only if it
// asked for them.
TEST(SseRelayTest, OnTokenIdsEveryCutGivesTheUninterruptedAnswerWhereTextDoesNot) {
  const TokenIdContinuation on{.ask = true, .completions_path = "/v1/completions"};
  int text_differs = 0, cuts = 0;
  for (LlmApi api : {LlmApi::kCompletions, LlmApi::kChat}) {
    // Answers whose text the tokenizer reads back otherwise (where text
    // continuation can go wrong), two; and one other.
    int odd = 0, plain = 0;
    for (int q = 0; odd < 2 || plain < 1; ++q) {
      const std::string prompt = absl::StrCat("what fails over? ", q);
      const std::string body =
          api == LlmApi::kChat
              ? absl::StrCat(R"({"model":"gpuha-tiny-bpe","stream":true,"max_tokens":30,
                   "stream_options":{"include_usage":true},
                   "messages":[{"role":"user","content":")",
                             prompt, R"("}]})")
              : absl::StrCat(R"({"model":"gpuha-tiny-bpe","stream":true,"max_tokens":30,
                   "stream_options":{"include_usage":true},"prompt":")",
                             prompt, R"("})");
      const std::string asked = body.substr(0, body.size() - 1) + R"(,"return_token_ids":true})";
      const std::string whole = Join(Stream(api, asked, "first"));
      auto want = worker::ParseStreamedAnswer(W(api), whole);
      ASSERT_TRUE(want.ok()) << want.status();
      const worker::Bpe& bpe = worker::Bpe::Get();
      if (bpe.Encode(bpe.Decode(want->token_ids)) != want->token_ids ? odd++ >= 2 : plain++ >= 1) {
        continue;
      }
      for (size_t cut = 0; cut < whole.size(); cut += 61) {
        std::string client = Continued(api, body, cut, on);
        auto got = worker::ParseStreamedAnswer(W(api), client);
        ASSERT_TRUE(got.ok()) << got.status() << " at " << cut << "\n" << client;
        EXPECT_EQ(got->text, want->text) << cut << "\n" << client;
        EXPECT_EQ(got->finish_reason, want->finish_reason) << cut;
        EXPECT_EQ(client.find("token_ids\":"), std::string::npos) << "not asked for: " << client;
        // On the IDs, or (cut before any token) the request again from the start.
        if (got->continued > 0) {
          EXPECT_NE(got->continued_by, "text") << cut << "\n" << client;
        }
        if (got->prompt_tokens) {
          EXPECT_EQ(got->prompt_tokens, want->prompt_tokens) << cut;
          EXPECT_EQ(got->completion_tokens, want->completion_tokens) << cut;
        }
        // The client that asked for the IDs gets them, each once.
        std::string with_ids = Continued(api, asked, cut, on);
        auto ids = worker::ParseStreamedAnswer(W(api), with_ids);
        ASSERT_TRUE(ids.ok()) << ids.status();
        EXPECT_EQ(ids->token_ids, want->token_ids) << cut << "\n" << with_ids;
        EXPECT_EQ(ids->prompt_token_ids, want->prompt_token_ids) << cut << "\n" << with_ids;
        // By text (token IDs off), the same cut.
        auto by_text = worker::ParseStreamedAnswer(W(api), Continued(api, body, cut));
        ASSERT_TRUE(by_text.ok()) << by_text.status();
        if (by_text->text != want->text) ++text_differs;
        ++cuts;
      }
    }
  }
  EXPECT_GT(cuts, 60);
  EXPECT_GT(text_differs, 0) << "by text, no cut of " << cuts << " went another way";
}

// An upstream that gives no IDs (or not for every chunk), or a chat with
// no completions route or no max_tokens: by text, and it says why.
TEST(SseRelayTest, WithoutEveryTokensIdTheContinuationIsByTextAndSaysWhy) {
  const TokenIdContinuation on{.ask = true, .completions_path = "/v1/completions"};
  struct Case {
    LlmApi api;
    std::string body;
    std::string events;
    TokenIdContinuation ids;
    std::string why;
  } cases[] = {
      {LlmApi::kCompletions, R"({"model":"m","stream":true,"prompt":"hi","max_tokens":9})",
       R"(data: {"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[5]}]})"
       "\n\n"
       R"(data: {"choices":[{"index":0,"text":" b"}]})"
       "\n\n",
       on, "the upstream sent text without its token_ids"},
      {LlmApi::kCompletions, R"({"model":"m","stream":true,"prompt":"hi","max_tokens":9})",
       R"(data: {"choices":[{"index":0,"text":" a","token_ids":[5]}]})"
       "\n\n",
       on, "the upstream gave no prompt_token_ids"},
      {LlmApi::kCompletions,
       R"({"model":"m","stream":true,"prompt":"hi","max_tokens":9,"stop":["\n\nUser:"]})",
       R"(data: {"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[5]}]})"
       "\n\n",
       on, "stop strings"},
      {LlmApi::kCompletions, R"({"model":"m","stream":true,"prompt":"hi","max_tokens":9})",
       R"(data: {"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[4294967295]}]})"
       "\n\n",
       on, "not token IDs"},
      {LlmApi::kCompletions, R"({"model":"m","stream":true,"prompt":"hi","max_tokens":9})",
       R"(data: {"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[]}]})"
       "\n\n",
       on, "text without its token_ids"},
      {LlmApi::kChat,
       R"({"model":"m","stream":true,"max_tokens":9,"tools":[{"type":"function"}],
           "messages":[{"role":"user","content":"x"}]})",
       R"(data: {"prompt_token_ids":[1],"choices":[{"index":0,"delta":{"content":" a"},"token_ids":[5]}]})"
       "\n\n",
       on, "offers tools"},
      {LlmApi::kChat,
       R"({"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"x"}]})",
       R"(data: {"prompt_token_ids":[1],"choices":[{"index":0,"delta":{"content":" a"},"token_ids":[5]}]})"
       "\n\n",
       TokenIdContinuation{.ask = true, .completions_path = ""}, "no completions route"},
      {LlmApi::kChat, R"({"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]})",
       R"(data: {"prompt_token_ids":[1],"choices":[{"index":0,"delta":{"content":" a"},"token_ids":[5]}]})"
       "\n\n",
       on, "no max_tokens"},
      {LlmApi::kCompletions,
       R"({"model":"m","stream":true,"prompt":"hi","max_tokens":9})",
       R"(data: {"choices":[{"index":0,"text":" a","prompt_token_ids":[1],"token_ids":[5]}]})"
       "\n\n",
       {},
       "llm.token_ids is off"},
  };
  for (Case& c : cases) {
    SseContinuity sc = Follow(c.api, c.body, 1 << 20, c.ids);
    std::string out;
    sc.Feed(c.events, &out);
    json next = json::parse(sc.BeginContinuation());
    EXPECT_FALSE(sc.by_token_ids()) << c.events;
    EXPECT_TRUE(sc.continuation_path().empty());
    EXPECT_NE(sc.How().find(c.why), std::string::npos) << sc.How();
    EXPECT_TRUE(c.api == LlmApi::kChat ? next.contains("messages") : next["prompt"].is_string());
  }
  // On the IDs: the prompt's and the delivered, the limit less those, and
  // a chat on the completions route with only what shapes its sampling.
  SseContinuity chat =
      Follow(LlmApi::kChat, R"({"model":"m","stream":true,"max_completion_tokens":9,
      "temperature":0,"tools":[],"messages":[{"role":"user","content":"x"}]})",
             1 << 20, on);
  EXPECT_EQ(json::parse(*chat.UpstreamBody())["return_token_ids"], true);
  std::string out;
  chat.Feed(
      R"(data: {"prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"content":" a"},"token_ids":[5]}]})"
      "\n\n",
      &out);
  EXPECT_EQ(out.find("token_ids\":"), std::string::npos) << out;
  json next = json::parse(chat.BeginContinuation());
  EXPECT_TRUE(chat.by_token_ids());
  EXPECT_EQ(chat.continuation_path(), "/v1/completions");
  EXPECT_EQ(next, json::parse(R"({"model":"m","stream":true,"temperature":0,"max_tokens":8,
                                  "prompt":[1,2,5],"return_token_ids":true})"));
}

// Broken before any token reached the client: the request again, as it
// was, and the answer says it was begun again.
TEST(SseRelayTest, NothingDeliveredAsksForTheWholeAnswerAgain) {
  const TokenIdContinuation on{.ask = true, .completions_path = "/v1/completions"};
  const std::string body =
      R"({"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"x"}]})";
  SseContinuity sc = Follow(LlmApi::kChat, body, 1 << 20, on);
  std::string out;
  sc.Feed(
      R"(data: {"id":"a","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"token_ids":[]}]})"
      "\n\n",
      &out);
  EXPECT_EQ(json::parse(sc.BeginContinuation()), json::parse(*sc.UpstreamBody()));
  EXPECT_TRUE(sc.continuation_path().empty());
  EXPECT_NE(sc.How().find("from the start"), std::string::npos) << sc.How();
  out.clear();
  sc.Feed(
      R"(data: {"id":"b","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"token_ids":[]}]})"
      "\n\n"
      R"(data: {"id":"b","choices":[{"index":0,"delta":{"content":" z"},"token_ids":[7]}]})"
      "\n\n",
      &out);
  EXPECT_EQ(out.find("\"role\""), std::string::npos) << out;  // the client had it
  EXPECT_NE(out.find(R"("gpuha_continued_by":"restart")"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("id":"a")"), std::string::npos) << out;
}

// A stream no longer followed (a tool call, which a continuation would
// lose) is relayed as it comes, without the IDs the client did not ask for.
TEST(SseRelayTest, AnUnfollowedStreamStillKeepsTheIdsTheClientDidNotAskFor) {
  const TokenIdContinuation on{.ask = true, .completions_path = "/v1/completions"};
  SseContinuity sc = Follow(
      LlmApi::kChat,
      R"({"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"x"}]})",
      1 << 20, on);
  std::string out;
  sc.Feed(
      R"(data: {"prompt_token_ids":[1],"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"token_ids":[5]}]})"
      "\n\n"
      R"(data: {"choices":[{"index":0,"delta":{"content":" a"},"token_ids":[6]}]})"
      "\n\n"
      R"(data: {"choices":[],"usage":{"prompt_tokens":1},"prompt_token_ids":[1]})"
      "\n\ndata: [DONE]\n\n",
      &out);
  EXPECT_TRUE(sc.CannotContinue());
  EXPECT_TRUE(sc.done());
  EXPECT_EQ(out.find("token_ids"), std::string::npos) << out;
  EXPECT_NE(out.find("tool_calls"), std::string::npos) << out;
  EXPECT_NE(out.find(" a"), std::string::npos) << out;
}

TEST(SseRelayTest, AChatIsContinuedOnItsSiblingCompletionsRoute) {
  LlmConfig c;
  c.routes = {{"/a/v1/chat/completions", LlmApi::kChat, true},
              {"/b/v1/completions", LlmApi::kCompletions, true},
              {"/a/v1/completions", LlmApi::kCompletions, true},
              {"/c/v1/chat/completions", LlmApi::kChat, true}};
  EXPECT_EQ(CompletionsRouteFor(c, c.routes[0]), "/a/v1/completions");
  EXPECT_EQ(CompletionsRouteFor(c, c.routes[3]), "");  // two others: which is not known
  c.routes.erase(c.routes.begin() + 2);
  EXPECT_EQ(CompletionsRouteFor(c, c.routes[2]), "/b/v1/completions");  // the only one
}

TEST(SseRelayTest, TheContinuationRequestCarriesTheDeliveredText) {
  SseContinuity sc =
      Follow(LlmApi::kCompletions, R"({"model":"m","stream":true,"prompt":"hi","max_tokens":10})");
  std::string out;
  EXPECT_EQ(sc.Feed("data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"text\":\" one\"}]}\n\n"
                    "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"text\":\" two\"}]}\n\ndata: {",
                    &out),
            2);
  EXPECT_EQ(sc.text(), " one two");
  // The partial event was held back from the client.
  EXPECT_EQ(out.find("data: {\n"), std::string::npos);
  EXPECT_EQ(out.substr(out.size() - 2), "\n\n");
  json next = json::parse(sc.BeginContinuation());
  EXPECT_EQ(next["prompt"], "hi one two");
  EXPECT_EQ(next["max_tokens"], 8);
  // No max_tokens: OpenAI's default of 16 for completions, less the two.
  SseContinuity d = Follow(LlmApi::kCompletions, R"({"model":"m","stream":true,"prompt":"hi"})");
  d.Feed("data: {\"choices\":[{\"text\":\" x\"}]}\n\n", &out);
  EXPECT_EQ(json::parse(d.BeginContinuation())["max_tokens"], 15);
  // Chat: an assistant prefix, or the existing one extended.
  SseContinuity c = Follow(LlmApi::kChat, R"({"model":"m","stream":true,"max_completion_tokens":5,
      "messages":[{"role":"user","content":"q"}]})");
  c.Feed("data: {\"choices\":[{\"delta\":{\"content\":\" a\"}}]}\n\n", &out);
  json cn = json::parse(c.BeginContinuation());
  EXPECT_EQ(cn["messages"].back(), (json{{"role", "assistant"}, {"content", " a"}}));
  EXPECT_EQ(cn["continue_final_message"], true);
  EXPECT_EQ(cn["add_generation_prompt"], false);
  EXPECT_EQ(cn["max_completion_tokens"], 4);
  EXPECT_FALSE(cn.contains("max_tokens"));
  c.Feed("data: {\"choices\":[{\"delta\":{\"content\":\" b\"}}]}\n\n", &out);
  json again = json::parse(c.BeginContinuation());
  EXPECT_EQ(again["messages"].size(), 2u);
  EXPECT_EQ(again["messages"].back()["content"], " a b");
  EXPECT_EQ(again["max_completion_tokens"], 3);
  EXPECT_EQ(c.continuations(), 2);
}

TEST(SseRelayTest, RequestsThatCannotBeContinuedSayWhy) {
  struct Case {
    LlmApi api;
    const char* body;
    const char* why;
  } cases[] = {
      {LlmApi::kCompletions, "{", "not a JSON object"},
      {LlmApi::kCompletions, R"({"prompt":"x"})", "not streamed"},
      {LlmApi::kCompletions, R"({"prompt":"x","stream":true,"n":2})", "more than one choice"},
      {LlmApi::kCompletions, R"({"prompt":"x","stream":true,"echo":true})", "echoes"},
      {LlmApi::kCompletions, R"({"prompt":["a","b"],"stream":true})", "not one string"},
      {LlmApi::kCompletions, R"({"prompt":"x","stream":true,"max_tokens":0})",
       "max_tokens is not a positive integer"},
      {LlmApi::kChat, R"({"stream":true,"messages":[]})", "no messages"},
      // Structured output: a continuation would start its grammar again.
      {LlmApi::kChat,
       R"({"stream":true,"messages":[{"role":"user","content":"x"}],)"
       R"("response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{}}}})",
       "response_format json_schema"},
      {LlmApi::kChat,
       R"({"stream":true,"messages":[{"role":"user","content":"x"}],)"
       R"("response_format":{"type":"json_object"}})",
       "response_format json_object"},
      {LlmApi::kCompletions, R"({"prompt":"x","stream":true,"guided_json":{"type":"object"}})",
       "grammar (guided_json)"},
      {LlmApi::kCompletions, R"({"prompt":"x","stream":true,"guided_regex":"[0-9]+"})",
       "grammar (guided_regex)"},
      {LlmApi::kChat,
       R"({"stream":true,"messages":[{"role":"user","content":"x"}],)"
       R"("structured_outputs":{"choice":["a","b"]}})",
       "grammar (structured_outputs)"},
      {LlmApi::kCompletions, R"({"prompt":"x","stream":true,"grammar":"root ::= \"a\""})",
       "grammar (grammar)"},
  };
  for (const Case& c : cases) {
    auto r = ReadLlmCall(c.api, c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status();
  }
  // Plain text output is continued as before.
  EXPECT_TRUE(ReadLlmCall(LlmApi::kChat, R"({"stream":true,"messages":[{"role":"user",)"
                                         R"("content":"x"}],"response_format":{"type":"text"}})")
                  .ok());
  SseContinuity untracked(LlmApi::kCompletions, std::nullopt, "continuation is off", 100);
  EXPECT_EQ(untracked.CannotContinue(), "continuation is off");
  // Text over the bound: relayed, not kept.
  SseContinuity small = Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true})", 4);
  std::string out;
  small.Feed("data: {\"choices\":[{\"text\":\" abcdef\"}]}\n\n", &out);
  EXPECT_NE(out.find("abcdef"), std::string::npos);
  EXPECT_NE(small.CannotContinue()->find("llm.max_text_bytes (4 bytes)"), std::string::npos);
  SseContinuity odd = Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true})");
  odd.Feed("data: not json\n\n", &out);
  EXPECT_NE(odd.CannotContinue()->find("not a JSON completion chunk"), std::string::npos);
  auto ev = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions,
                                        SseContinuity::ErrorEvent("no standby"));
  EXPECT_NE(ev.status().message().find("no standby"), std::string::npos);
}

TEST(SseRelayTest, AnUpstreamsErrorChunkIsHeldAndOnlyAMissingEndIsMadeUp) {
  SseContinuity sc = Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true,"max_tokens":2})");
  std::string out, full_out;
  sc.Feed(
      "data: {\"id\":\"a\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
      "\"text\":\" p\",\"finish_reason\":null}]}\n\n"
      "data: {\"error\":{\"message\":\"engine dead\"}}\n\n",
      &out);
  EXPECT_EQ(sc.upstream_error(), "engine dead");
  EXPECT_EQ(out.find("engine dead"), std::string::npos);
  EXPECT_FALSE(sc.OnlyTheEndIsMissing());  // one token of two: the rest is asked for
  sc.Feed("", &out);
  // Both tokens, no finish chunk and no [DONE]: a finish chunk ("length") is made up.
  SseContinuity full =
      Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true,"max_tokens":2})");
  full.Feed(
      "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"text\":\" p\"}]}\n\n"
      "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"text\":\" q\"}]}\n\n",
      &full_out);
  auto end = full.OnlyTheEndIsMissing();
  ASSERT_TRUE(end);
  auto a = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions, full_out + *end);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->finish_reason, "length");
  EXPECT_EQ(a->text, " p q");
}

// What an upstream or a client sends may have any JSON type anywhere:
// nothing throws (an exception would end the router's loop).
TEST(SseRelayTest, WrongJsonTypesFromEitherSideNeverThrow) {
  SseContinuity sc = Follow(LlmApi::kChat, R"({"stream":true,"max_tokens":9,
      "max_completion_tokens":4,"continue_final_message":"yes",
      "messages":[{"role":7,"content":"q"}]})");
  std::string out;
  EXPECT_NO_THROW(
      sc.Feed("data: {\"choices\":[{\"index\":\"x\",\"delta\":{\"content\":\" a\"}}]}\n\n"
              "data: {\"choices\":\"none\"}\n\n"
              "data: {\"choices\":[7],\"usage\":{\"prompt_tokens\":\"many\"}}\n\n",
              &out));
  std::string body;
  EXPECT_NO_THROW(body = sc.BeginContinuation());
  json next = json::parse(body);
  // The first chunk's text counted (an index that is no number reads as 0),
  // the odd ones not; the stream is no longer followed after a choice that
  // is not an object.
  EXPECT_EQ(next["max_completion_tokens"], 3);
  EXPECT_NE(sc.CannotContinue()->find("not an object"), std::string::npos);
  EXPECT_EQ(next["messages"].size(), 2u);
  out.clear();
  EXPECT_NO_THROW(
      sc.Feed("data: {\"id\":1,\"usage\":{\"prompt_tokens\":\"x\"},\"choices\":[]}\n\n", &out));
  // Usage that is no whole number, or that cannot hold the tokens already
  // sent, is relayed as it came, never made up (it once read -3).
  sc.Feed("data: {\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":2},\"choices\":[]}\n\n",
          &out);
  EXPECT_NE(out.find(R"("prompt_tokens":"x")"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("prompt_tokens":0,)"), std::string::npos) << out;
  EXPECT_EQ(out.find(":-"), std::string::npos) << out;
  // The tighter of two limits decides what is left.
  SseContinuity two = Follow(LlmApi::kChat, R"({"stream":true,"max_tokens":9,
      "max_completion_tokens":1,"messages":[{"role":"user","content":"q"}]})");
  std::string o2;
  two.Feed("data: {\"choices\":[{\"delta\":{\"content\":\" a\"}}]}\n\n", &o2);
  ASSERT_TRUE(two.OnlyTheEndIsMissing());
}

TEST(SseRelayTest, AStreamNoLongerFollowedStillEndsAndAnErrorEndsTheTakeOfIt) {
  // Not followed after an odd event, but its [DONE] is seen: no false break.
  SseContinuity odd = Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true})");
  std::string out;
  odd.Feed("data: not json\n\ndata: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: [DONE]\n\n", &out);
  EXPECT_TRUE(odd.done());
  EXPECT_TRUE(odd.CannotContinue());
  // An error chunk: what came before it goes out, what comes after does not.
  SseContinuity err = Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true})");
  std::string o2;
  EXPECT_EQ(err.Feed("data: {\"choices\":[{\"text\":\" a\"}]}\n\n"
                     "data: {\"error\":{\"message\":\"gone\"}}\n\n"
                     "data: {\"choices\":[{\"text\":\" b\"}]}\n\n",
                     &o2),
            1);
  EXPECT_NE(o2.find(" a"), std::string::npos);
  EXPECT_EQ(o2.find(" b"), std::string::npos);
  EXPECT_EQ(err.text(), " a");
  // JSON nested past the limit: refused from a client, not followed from
  // an upstream (a deep value would overflow the stack when copied).
  std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_NE(ReadLlmCall(LlmApi::kCompletions, R"({"stream":true,"prompt":"x","a":)" + deep + "}")
                .status()
                .message()
                .find("nests too deep"),
            std::string::npos);
  SseContinuity d = Follow(LlmApi::kCompletions, R"({"prompt":"x","stream":true})");
  d.Feed("data: {\"x\":" + deep + "}\n\n", &out);
  EXPECT_NE(d.CannotContinue()->find("too deep"), std::string::npos);
}

TEST(SseRelayTest, LlmRoutesMatchThePathWithoutItsQuery) {
  LlmConfig c;
  EXPECT_EQ(FindLlmRoute(c, "/v1/completions?x=1")->api, LlmApi::kCompletions);
  EXPECT_EQ(FindLlmRoute(c, "/v1/chat/completions")->api, LlmApi::kChat);
  EXPECT_EQ(FindLlmRoute(c, "/v1/completionsX"), nullptr);
  EXPECT_EQ(FindLlmRoute(c, "/v2/models/cv/infer"), nullptr);
}

}  // namespace
}  // namespace gpuha::router
