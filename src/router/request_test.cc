#include "router/request.h"

#include <gtest/gtest.h>

namespace gpuha::router {
namespace {

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
  EXPECT_EQ(ApiKey(Parse("GET / HTTP/1.1\r\n\r\n")), "");
}

TEST(RequestTest, UpstreamHeadDropsHopByHopAndSecrets) {
  auto h = Parse(
      "POST /streams/s/infer HTTP/1.1\r\nHost: router\r\nConnection: keep-alive\r\n"
      "X-Api-Key: secret\r\nAuthorization: Bearer secret\r\nX-Gpuha-Tenant: forged\r\n"
      "Transfer-Encoding: chunked\r\nX-Forwarded-For: 10.0.0.1\r\nContent-Type: a/b\r\n\r\n");
  std::string out;
  AppendUpstreamHead(h, "/infer", "127.0.0.1:9001", "acme", "s", "127.0.0.2", Framing::kLength, 42,
                     &out);
  EXPECT_EQ(out.rfind("POST /infer HTTP/1.1\r\nHost: 127.0.0.1:9001\r\n", 0), 0u) << out;
  EXPECT_EQ(out.find("secret"), std::string::npos) << out;
  EXPECT_EQ(out.find("forged"), std::string::npos) << out;
  EXPECT_EQ(out.find("chunked"), std::string::npos) << out;
  EXPECT_EQ(out.find("keep-alive"), std::string::npos) << out;
  EXPECT_NE(out.find("X-Forwarded-For: 10.0.0.1, 127.0.0.2\r\n"), std::string::npos) << out;
  EXPECT_NE(out.find("X-Gpuha-Tenant: acme\r\n"), std::string::npos);
  EXPECT_NE(out.find("Content-Type: a/b\r\n"), std::string::npos);
  EXPECT_NE(out.find("Content-Length: 42\r\n\r\n"), std::string::npos);
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
