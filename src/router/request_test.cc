#include "router/request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::router {
namespace {

using ::testing::HasSubstr;

RequestHeader Parse(const std::string& text) {
  RequestParser<http::empty_body> p;
  boost::system::error_code ec;
  p.put(boost::asio::buffer(text), ec);
  EXPECT_FALSE(ec) << ec.message();
  return p.release().base();
}

TEST(RequestTest, StreamFromPathStripsThePrefix) {
  StreamRef r = ExtractStream("", "/streams/cam-1/v2/models/m/infer?x=1");
  EXPECT_FALSE(r.bad);
  EXPECT_EQ(r.stream, "cam-1");
  EXPECT_EQ(r.target, "/v2/models/m/infer?x=1");
  EXPECT_EQ(ExtractStream("", "/streams/cam-1").target, "/");
  EXPECT_EQ(ExtractStream("", "/streams/cam-1?q").target, "/?q");
}

TEST(RequestTest, StreamFromHeaderAndConflicts) {
  StreamRef r = ExtractStream("cam-2", "/v2/models/m/infer");
  EXPECT_EQ(r.stream, "cam-2");
  EXPECT_EQ(r.target, "/v2/models/m/infer");
  EXPECT_TRUE(ExtractStream("cam-2", "/streams/cam-1/x").bad);  // they must agree
  EXPECT_FALSE(ExtractStream("cam-1", "/streams/cam-1/x").bad);
  EXPECT_TRUE(ExtractStream("bad id", "/").bad);
  EXPECT_TRUE(ExtractStream("", "/streams//x").bad);
  EXPECT_TRUE(ExtractStream(std::string(129, 'a'), "/").bad);
  EXPECT_TRUE(ExtractStream("", "/").stream.empty());
}

TEST(RequestTest, ApiKeyFromBearerOrHeader) {
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\nAuthorization: Bearer abc\r\n\r\n")), "abc");
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\nauthorization: bearer abc\r\n\r\n")), "abc");
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\nX-Api-Key: k2\r\n\r\n")), "k2");
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\nAuthorization: Basic abc\r\n\r\n")), "");
  // Regression: Basic (for a proxy in front) hid a valid X-Api-Key: 401.
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\nAuthorization: Basic abc\r\nX-Api-Key: k2\r\n\r\n")),
            "k2");
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\n\r\n")), "");
}

TEST(RequestTest, UpstreamHeadDropsHopByHopAndSecrets) {
  auto h = Parse(
      "POST /streams/s/infer HTTP/1.1\r\nHost: router\r\nConnection: keep-alive\r\n"
      "X-Api-Key: secret\r\nAuthorization: Bearer secret\r\nX-Gpuha-Tenant: forged\r\n"
      "Transfer-Encoding: chunked\r\nX-Forwarded-For: 10.0.0.1\r\nContent-Type: a/b\r\n"
      "X_Api_Key: underscored\r\nX_Gpuha_Tenant: underscored\r\n\r\n");
  std::string out;
  AppendUpstreamHead(h, "/infer", "127.0.0.1:9001", "acme", "s", "127.0.0.2", Framing::kLength, 42,
                     &out);
  EXPECT_EQ(out.rfind("POST /infer HTTP/1.1\r\nHost: 127.0.0.1:9001\r\n", 0), 0u) << out;
  EXPECT_EQ(out.find("secret"), std::string::npos) << out;
  EXPECT_EQ(out.find("forged"), std::string::npos) << out;
  EXPECT_EQ(out.find("underscored"), std::string::npos) << out;  // '_' names dropped, as nginx
  EXPECT_EQ(out.find("chunked"), std::string::npos) << out;
  EXPECT_EQ(out.find("keep-alive"), std::string::npos) << out;
  EXPECT_NE(out.find("X-Forwarded-For: 10.0.0.1, 127.0.0.2\r\n"), std::string::npos) << out;
  EXPECT_NE(out.find("X-Gpuha-Tenant: acme\r\n"), std::string::npos);
  EXPECT_NE(out.find("Content-Type: a/b\r\n"), std::string::npos);
  EXPECT_NE(out.find("Content-Length: 42\r\n\r\n"), std::string::npos);
}

std::optional<HeadProblem> Check(const std::string& head) {
  return CheckHead(Parse(head + "\r\n"));
}

TEST(RequestTest, ADeclaredExpectationIsReadStrictly) {
  std::chrono::milliseconds ms{7};
  EXPECT_FALSE(ReadExpectation(Parse("POST /x HTTP/1.1\r\nHost: h\r\n\r\n"), &ms));
  EXPECT_EQ(ms.count(), 0);  // absent: nothing declared
  EXPECT_FALSE(ReadExpectation(
      Parse("POST /x HTTP/1.1\r\nHost: h\r\nX-Gpuha-Expect-Ms: 20000\r\n\r\n"), &ms));
  EXPECT_EQ(ms.count(), 20000);
  for (const char* bad :
       {"0", "-5", "1.5", "12ms", "", "3600001", "99999999999999999999", "0x10"}) {
    auto p = ReadExpectation(
        Parse(std::string("POST /x HTTP/1.1\r\nHost: h\r\nX-Gpuha-Expect-Ms: ") + bad + "\r\n\r\n"),
        &ms);
    ASSERT_TRUE(p.has_value()) << bad;
    EXPECT_EQ(p->reason, Reason::kBadRequest);
    EXPECT_THAT(p->detail, HasSubstr("X-Gpuha-Expect-Ms: expected whole milliseconds")) << bad;
  }
  auto twice = ReadExpectation(Parse("POST /x HTTP/1.1\r\nHost: h\r\nX-Gpuha-Expect-Ms: 5\r\n"
                                     "X-Gpuha-Expect-Ms: 6\r\n\r\n"),
                               &ms);
  ASSERT_TRUE(twice.has_value());
  EXPECT_THAT(twice->detail, HasSubstr("more than once"));
}

// Regression (request smuggling): these codings were forwarded without their
// body, which the upstream then read as the next request.
TEST(RequestTest, TransferCodingsOtherThanChunkedAreRefused) {
  const std::string post = "POST /streams/a/x HTTP/1.1\r\nHost: h\r\n";
  EXPECT_FALSE(Check(post + "Transfer-Encoding: chunked\r\n"));
  EXPECT_FALSE(Check(post + "Transfer-Encoding: Chunked\r\n"));
  EXPECT_FALSE(Check(post + "Content-Length: 3\r\n"));
  for (const char* te : {"gzip", "deflate", "chunked, gzip"}) {
    auto p = Check(post + "Transfer-Encoding: " + te + "\r\n");
    ASSERT_TRUE(p) << te;
    EXPECT_EQ(ReasonStatus(p->reason), 400) << te;
    EXPECT_NE(p->detail.find("final transfer coding must be chunked"), std::string::npos) << te;
  }
  for (const char* te : {"xchunked", "identity", "chunked, identity", "gzip, chunked"}) {
    auto p = Check(post + "Transfer-Encoding: " + te + "\r\n");
    ASSERT_TRUE(p) << te;
    EXPECT_EQ(ReasonStatus(p->reason), 501) << te;
  }
  auto old = CheckHead(Parse("POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"));
  ASSERT_TRUE(old);  // RFC 9112 6.1: faulty framing in HTTP/1.0
  EXPECT_EQ(ReasonStatus(old->reason), 400);
  auto two = Check(post + "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n");
  ASSERT_TRUE(two);
  EXPECT_EQ(ReasonStatus(two->reason), 501);
}

TEST(RequestTest, HostAndMethodChecks) {
  EXPECT_EQ(ReasonStatus(Check("CONNECT h:443 HTTP/1.1\r\nHost: h\r\n")->reason), 405);
  EXPECT_EQ(ReasonStatus(Check("OPTIONS * HTTP/1.1\r\nHost: h\r\n")->reason), 405);
  EXPECT_FALSE(Check("OPTIONS /streams/a/x HTTP/1.1\r\nHost: h\r\n"));
  EXPECT_NE(Check("GET / HTTP/1.1\r\n")->detail.find("needs a Host"), std::string::npos);
  EXPECT_NE(Check("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n")->detail.find("more than one"),
            std::string::npos);
  EXPECT_FALSE(Check("GET / HTTP/1.0\r\n"));  // HTTP/1.0 has no Host rule
}

// Regression: these spellings reached another tenant's stream, or the
// upstream as "/../../streams/b/...".
TEST(RequestTest, TargetsAreNormalizedBeforeRouting) {
  EXPECT_EQ(NormalizeTarget("/streams/a/x?q=1"), "/streams/a/x?q=1");
  EXPECT_EQ(NormalizeTarget("//streams/b/x"), "/streams/b/x");
  EXPECT_EQ(NormalizeTarget("/./streams/b/x"), "/streams/b/x");
  EXPECT_EQ(NormalizeTarget("/streams/a/../../streams/b/x"), "/streams/b/x");
  EXPECT_EQ(NormalizeTarget("/streams/a/%2e%2E/b/x"), "/streams/b/x");
  EXPECT_EQ(NormalizeTarget("/%73treams/b/x"), "/streams/b/x");  // unreserved escapes decoded
  EXPECT_EQ(NormalizeTarget("/a%2fb"), "/a%2Fb");                // others kept, upper case
  EXPECT_EQ(NormalizeTarget("/a/b/"), "/a/b/");
  EXPECT_EQ(NormalizeTarget("/a/b/.."), "/a/");
  EXPECT_EQ(NormalizeTarget("/"), "/");
  EXPECT_EQ(NormalizeTarget("/x?p=/../y"), "/x?p=/../y");  // the query is not a path
  EXPECT_EQ(NormalizeTarget("http://other.example/streams/b/x?q"), "/streams/b/x?q");
  EXPECT_EQ(NormalizeTarget("http://other.example"), "/");
  EXPECT_EQ(NormalizeTarget("http://h?q"), "/?q");
  EXPECT_FALSE(NormalizeTarget("/../x"));
  EXPECT_FALSE(NormalizeTarget("/a/../../x"));
  EXPECT_FALSE(NormalizeTarget("/a%2"));
  EXPECT_FALSE(NormalizeTarget("/a%zz"));
  EXPECT_FALSE(NormalizeTarget("*"));
  EXPECT_FALSE(NormalizeTarget("streams/a"));
  EXPECT_FALSE(NormalizeTarget(""));
  // "/Streams/" is another path (paths are case-sensitive): it names no stream.
  EXPECT_TRUE(ExtractStream("", *NormalizeTarget("/Streams/b/x")).stream.empty());
}

TEST(RequestTest, ErrorResponseIsJsonWithRetryAfter) {
  std::string r = ErrorResponse(Reason::kRateLimited, "too \"fast\"", "cam-1", 3, false);
  EXPECT_EQ(r.rfind("HTTP/1.1 429 Too Many Requests\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Retry-After: 3\r\n"), std::string::npos);
  EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos);
  EXPECT_NE(r.find(R"({"error":"rate_limited","reason":"too \"fast\"","stream":"cam-1"})"),
            std::string::npos)
      << r;
  for (int i = 0; i < static_cast<int>(Reason::kCount); ++i) {
    EXPECT_GE(ReasonStatus(static_cast<Reason>(i)), 400);
    EXPECT_NE(std::string(ReasonLabel(static_cast<Reason>(i))), "");
  }
}

TEST(RequestTest, ChunkHeader) {
  std::string s;
  AppendChunkHeader(0x1a2b, &s);
  EXPECT_EQ(s, "1a2b\r\n");
}

}  // namespace
}  // namespace gpuha::router
