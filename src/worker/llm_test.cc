#include "worker/llm.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gpuha::worker {
namespace {

LlmRequest Req(const std::string& prompt, int max_tokens) {
  LlmRequest r;
  r.model = kLlmModelName;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  return r;
}

TEST(LlmTest, SameTextSameAnswerAndContinuationGivesTheRest) {
  int checked = 0;
  for (int p = 0; p < 50; ++p) {
    std::string prompt = absl::StrCat("prompt number ", p, " about failover");
    LlmAnswer whole = Complete(Req(prompt, 200));
    EXPECT_EQ(Complete(Req(prompt, 200)).text, whole.text);
    EXPECT_EQ(whole.completion_tokens, CountTokens(whole.text));
    EXPECT_EQ(whole.prompt_tokens, CountTokens(prompt));
    // From every prefix of k tokens, the continuation is the rest, and the
    // token counts add up to the uninterrupted answer's.
    TinyLm lm(prompt);
    std::string delivered;
    for (int k = 0; k < whole.completion_tokens; ++k) {
      LlmAnswer rest = Complete(Req(prompt + delivered, 200 - k));
      ASSERT_EQ(delivered + rest.text, whole.text) << p << " at " << k;
      EXPECT_EQ(rest.finish_reason, whole.finish_reason);
      EXPECT_EQ(rest.prompt_tokens - k, whole.prompt_tokens);
      EXPECT_EQ(rest.completion_tokens + k, whole.completion_tokens);
      delivered.append(lm.Next().text);
      ++checked;
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(BpeTest, EveryWordIsOneTokenAndAnyBytesComeBack) {
  const Bpe& bpe = Bpe::Get();
  EXPECT_EQ(bpe.words().size(), 64u);
  EXPECT_GT(bpe.pieces().size(), 30u);
  for (int w : bpe.words()) {
    EXPECT_EQ(bpe.Encode(bpe.Text(w)), std::vector<int>{w}) << bpe.Text(w);
  }
  for (int p : bpe.pieces()) EXPECT_GT(bpe.Text(p).size(), 1u);
  std::string bytes;
  for (int i = 0; i < 600; ++i) bytes.push_back(static_cast<char>((i * 37) % 256));
  for (const std::string& t : {std::string(" the river"), std::string("  two  spaces "),
                               std::string(200, 'x'), bytes, std::string()}) {
    EXPECT_EQ(bpe.Decode(bpe.Encode(t)), t);
  }
  // A generated " ri"+"ver" (or any split of a word) reads back as the word.
  const std::vector<int> river = bpe.Encode(" river");
  ASSERT_EQ(river.size(), 1u);
  std::vector<int> split;
  for (size_t at = 1; at < 6 && split.empty(); ++at) {
    std::vector<int> a = bpe.Encode(std::string(" river").substr(0, at));
    std::vector<int> b = bpe.Encode(std::string(" river").substr(at));
    if (a.size() == 1 && b.size() == 1) split = {a[0], b[0]};
  }
  ASSERT_EQ(split.size(), 2u) << "no merge made \" river\" of two pieces";
  EXPECT_EQ(bpe.Decode(split), " river");
  EXPECT_EQ(bpe.Encode(bpe.Decode(split)), river);
}

LlmRequest BpeReq(const std::string& prompt, int max_tokens) {
  LlmRequest r = Req(prompt, max_tokens);
  r.model = kLlmBpeModelName;
  return r;
}

// The issue's figure: 200 greedy answers cut at every token position. On
// the token IDs (prompt_token_ids + the IDs delivered) every continuation
// is the rest of the answer; by text (the prompt and the delivered text,
// tokenized again) some go another way. Both counts are printed for
// bench/RESULTS.md.
TEST(LlmTest, TokenIdContinuationIsExactWhereTextContinuationIsNot) {
  int cuts = 0, text_mismatches = 0, answers_text_broke = 0;
  for (int p = 0; p < 200; ++p) {
    const std::string prompt = absl::StrCat("prompt number ", p, " about failover");
    const int max = 48;
    LlmAnswer whole = Complete(BpeReq(prompt, max));
    ASSERT_EQ(whole.token_ids.size(), static_cast<size_t>(whole.completion_tokens));
    ASSERT_EQ(Bpe::Get().Decode(whole.token_ids), whole.text);
    bool broke = false;
    for (int k = 0; k <= whole.completion_tokens; ++k) {
      std::vector<int> delivered(whole.token_ids.begin(), whole.token_ids.begin() + k);
      LlmRequest by_ids = BpeReq("", max - k);
      by_ids.prompt_ids = whole.prompt_token_ids;
      by_ids.prompt_ids->insert(by_ids.prompt_ids->end(), delivered.begin(), delivered.end());
      LlmAnswer rest = Complete(by_ids);
      std::vector<int> joined = delivered;
      joined.insert(joined.end(), rest.token_ids.begin(), rest.token_ids.end());
      ASSERT_EQ(joined, whole.token_ids) << p << " cut at " << k;
      if (max - k > 0) {
        EXPECT_EQ(rest.finish_reason, whole.finish_reason);
      }
      const std::string text = Bpe::Get().Decode(delivered);
      if (max - k > 0 && text + Complete(BpeReq(prompt + text, max - k)).text != whole.text) {
        ++text_mismatches;
        broke = true;
      }
      ++cuts;
    }
    answers_text_broke += broke ? 1 : 0;
  }
  std::printf(
      "200 greedy answers, %d cuts: on token IDs 0 differ; by text %d cuts differ (%d answers)\n",
      cuts, text_mismatches, answers_text_broke);
  EXPECT_GT(cuts, 2000);
  EXPECT_GT(text_mismatches, 0);  // what the token IDs are for
}

TEST(LlmTest, TokenIdPromptsAndReturnedIdsAsVllmHasThem) {
  auto r = ParseLlmRequest(LlmApi::kCompletions,
                           R"({"model":"gpuha-tiny-bpe","prompt":[300,301,65],"max_tokens":5,
                               "return_token_ids":true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_ids, (std::vector<int>{300, 301, 65}));
  EXPECT_TRUE(r->return_token_ids);
  EXPECT_EQ(Complete(*r).prompt_tokens, 3);
  struct Case {
    const char* body;
    const char* error;
  } cases[] = {
      {R"({"model":"gpuha-tiny","prompt":[1,2]})", "prompt: token IDs need the model"},
      {R"({"model":"gpuha-tiny-bpe","prompt":[]})", "prompt: 1 to"},
      {R"({"model":"gpuha-tiny-bpe","prompt":[1,"x"]})", "prompt[1]: not a token ID"},
      {R"({"model":"gpuha-tiny-bpe","prompt":[1,99999]})", "prompt[1]: not a token ID"},
      {R"({"model":"gpuha-tiny-bpe","prompt":"x","return_token_ids":1})", "return_token_ids: must"},
  };
  for (const Case& c : cases) {
    auto bad = ParseLlmRequest(LlmApi::kCompletions, c.body);
    ASSERT_FALSE(bad.ok()) << c.body;
    EXPECT_NE(bad.status().message().find(c.error), std::string::npos) << bad.status();
  }
  // Streamed with IDs: the prompt's in the first chunk (the choice for a
  // completion, beside the choices for chat), each token's in its chunk.
  const std::vector<int> prompt = {7, 8};
  for (LlmApi api : {LlmApi::kCompletions, LlmApi::kChat}) {
    std::string sse;
    if (api == LlmApi::kChat) {
      absl::StrAppend(&sse, "data: ",
                      LlmChunkJson(api, "c", 1, "m", "", std::nullopt, true, ChunkIds{{}, &prompt}),
                      "\n\n");
    }
    absl::StrAppend(&sse, "data: ",
                    LlmChunkJson(api, "c", 1, "m", " the", std::nullopt, false,
                                 ChunkIds{300, api == LlmApi::kChat ? nullptr : &prompt}),
                    "\n\n");
    absl::StrAppend(&sse, "data: ", LlmChunkJson(api, "c", 1, "m", "", "stop", false, ChunkIds{}),
                    "\n\n");
    auto a = ParseStreamedAnswer(api, sse + "data: [DONE]\n\n");
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->prompt_token_ids, prompt);
    EXPECT_EQ(a->token_ids, std::vector<int>{300});
  }
}

// Held to a format (response_format json_schema or json_object), an answer
// is one JSON document, on either model, and closes before max_tokens.
TEST(LlmTest, StructuredAnswersAreOneJsonDocument) {
  for (const char* model : {kLlmModelName, kLlmBpeModelName}) {
    for (int p = 0; p < 100; ++p) {
      const int max = 4 + p % 60;
      auto r = ParseLlmRequest(
          LlmApi::kCompletions,
          absl::StrCat(R"({"model":")", model, R"(","prompt":"json )", p, R"(","max_tokens":)", max,
                       R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a",)",
                       R"("schema":{"type":"object"}}}})"));
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(r->structured);
      LlmAnswer a = Complete(*r);
      if (max < 16) continue;  // the BPE model's opening and closing take 10 or so
      nlohmann::json doc = nlohmann::json::parse(a.text, nullptr, false);
      ASSERT_TRUE(doc.is_object()) << model << " " << a.text;
      EXPECT_TRUE(doc["answer"].is_string()) << a.text;
      EXPECT_EQ(a.finish_reason, "stop") << a.text;
      EXPECT_LE(a.completion_tokens, max);
      if (std::string(model) == kLlmBpeModelName) {
        EXPECT_EQ(Bpe::Get().Decode(a.token_ids), a.text);
      }
    }
  }
  auto bad = ParseLlmRequest(LlmApi::kChat, R"({"model":"m","response_format":{"type":"yaml"},
      "messages":[{"role":"user","content":"x"}]})");
  EXPECT_NE(bad.status().message().find("response_format.type: 'yaml'"), std::string::npos)
      << bad.status();
}

TEST(LlmTest, FieldsThatAreNotOpenAisAreNamedAsOpenAiNamesThem) {
  EXPECT_EQ(UnknownOpenAiField(LlmApi::kCompletions,
                               R"({"model":"m","prompt":"x","return_token_ids":true})"),
            "Unrecognized request argument supplied: return_token_ids");
  EXPECT_EQ(UnknownOpenAiField(LlmApi::kChat, R"({"model":"m","messages":[],"prompt":"x"})"),
            "Unrecognized request argument supplied: prompt");
  EXPECT_EQ(UnknownOpenAiField(LlmApi::kChat, R"({"model":"m","messages":[],"max_tokens":3,
                                                  "stream":true,"seed":1})"),
            std::nullopt);
}

TEST(LlmTest, AnswersEndByLengthOrByTheEndToken) {
  int stops = 0, lengths = 0;
  for (int p = 0; p < 200; ++p) {
    LlmAnswer a = Complete(Req(absl::StrCat("q", p), 64));
    EXPECT_LE(a.completion_tokens, 64);
    if (a.finish_reason == "stop") {
      ++stops;
      EXPECT_LT(a.completion_tokens, 64);
    } else {
      ++lengths;
      EXPECT_EQ(a.finish_reason, "length");
      EXPECT_EQ(a.completion_tokens, 64);
    }
  }
  // About one draw in 48 ends the text: both kinds occur.
  EXPECT_GT(stops, 20);
  EXPECT_GT(lengths, 20);
}

TEST(LlmTest, ChatRendersMessagesAndContinuesAnAssistantPrefix) {
  auto r = ParseLlmRequest(LlmApi::kChat, R"({"model":"gpuha-tiny","max_tokens":40,
      "messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
  LlmAnswer whole = Complete(*r);
  ASSERT_GT(whole.completion_tokens, 3);
  // The first three tokens, given back as an assistant prefix to continue.
  std::string prefix;
  TinyLm lm(r->prompt);
  for (int i = 0; i < 3; ++i) prefix.append(lm.Next().text);
  auto c = ParseLlmRequest(
      LlmApi::kChat,
      absl::StrCat(R"({"model":"gpuha-tiny","max_tokens":37,"continue_final_message":true,
      "add_generation_prompt":false,"messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":"hi"},{"role":"assistant","content":")",
                   prefix, R"("}]})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(prefix + Complete(*c).text, whole.text);
}

TEST(LlmTest, BadRequestsNameTheField) {
  struct Case {
    LlmApi api;
    const char* body;
    const char* error;
  } cases[] = {
      {LlmApi::kCompletions, "{", "body: not JSON"},
      {LlmApi::kCompletions, "[]", "body: not a JSON object"},
      {LlmApi::kCompletions, R"({"prompt":"x"})", "model: required"},
      {LlmApi::kCompletions, R"({"model":"m"})", "prompt: required"},
      {LlmApi::kCompletions, R"({"model":"m","prompt":"x","max_tokens":0})", "max_tokens: must"},
      {LlmApi::kCompletions, R"({"model":"m","prompt":"x","max_tokens":1.5})", "max_tokens: must"},
      {LlmApi::kCompletions, R"({"model":"m","prompt":"x","stream":"yes"})", "stream: must"},
      {LlmApi::kCompletions, R"({"model":"m","prompt":"x","n":2})", "n: only 1"},
      {LlmApi::kCompletions, R"({"model":"m","prompt":"x","stream_options":{"include_usage":1}})",
       "stream_options.include_usage: must"},
      {LlmApi::kChat, R"({"model":"m","messages":[]})", "messages: required"},
      {LlmApi::kChat, R"({"model":"m","messages":[{"role":"robot","content":"x"}]})",
       "messages[0].role: 'robot'"},
      {LlmApi::kChat, R"({"model":"m","messages":[{"role":"user"}]})",
       "messages[0].content: required"},
      {LlmApi::kChat,
       R"({"model":"m","continue_final_message":true,"messages":[{"role":"user","content":"x"}]})",
       "the last message must be the assistant's"},
  };
  for (const Case& c : cases) {
    auto r = ParseLlmRequest(c.api, c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos)
        << c.body << " -> " << r.status();
  }
}

TEST(LlmTest, StreamedAnswersAreReadBackAndCutOnesAreNamed) {
  std::string sse;
  for (const char* t : {" a", " b"}) {
    absl::StrAppend(
        &sse, "data: ", LlmChunkJson(LlmApi::kCompletions, "c1", 1, "m", t, std::nullopt), "\n\n");
  }
  absl::StrAppend(&sse, "data: ", LlmChunkJson(LlmApi::kCompletions, "c1", 1, "m", " c", "length"),
                  "\n\n");
  absl::StrAppend(&sse, "data: ", LlmUsageChunkJson(LlmApi::kCompletions, "c1", 1, "m", 4, 3),
                  "\n\n");
  auto a = ParseStreamedAnswer(LlmApi::kCompletions, sse + "data: [DONE]\n\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->text, " a b c");
  EXPECT_EQ(a->finish_reason, "length");
  EXPECT_EQ(a->chunks, 3);
  EXPECT_EQ(a->completion_tokens, 3);
  EXPECT_EQ(a->ids, std::vector<std::string>{"c1"});
  auto cut = ParseStreamedAnswer(LlmApi::kCompletions, sse);
  EXPECT_NE(cut.status().message().find("no [DONE]"), std::string::npos) << cut.status();
  auto half = ParseStreamedAnswer(LlmApi::kCompletions, sse + "data: {\"id\"");
  EXPECT_NE(half.status().message().find("inside an event"), std::string::npos) << half.status();
  auto err =
      ParseStreamedAnswer(LlmApi::kCompletions,
                          sse + "event: error\ndata: {\"error\":{\"message\":\"no standby\"}}\n\n");
  EXPECT_NE(err.status().message().find("no standby"), std::string::npos) << err.status();
  auto dup = ParseStreamedAnswer(
      LlmApi::kCompletions,
      sse + "data: " + LlmChunkJson(LlmApi::kCompletions, "c1", 1, "m", " d", std::nullopt) +
          "\n\ndata: [DONE]\n\n");
  EXPECT_NE(dup.status().message().find("text after the finish reason"), std::string::npos)
      << dup.status();
}

}  // namespace
}  // namespace gpuha::worker
