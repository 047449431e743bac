#include "worker/llm.h"

#include <gtest/gtest.h>

#include <string>

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
