// H2Server against nghttp2's own client (and hand-made frames): requests,
// answers with trailers, and the hostile clients of the HTTP/2 CVEs: rapid
// reset, CONTINUATION floods, HPACK bombs, stream-count exhaustion.
#include "router/h2_server.h"

#include <gtest/gtest.h>

#include <map>

#include "router/testing/h2_frames.h"

namespace gpuha::router {
namespace {

using gpuha::router::testing::Frame;

// nghttp2's client session as a test peer: what it sends, and what it
// heard back (streams' headers, data, close codes, GOAWAY).
class Client {
 public:
  Client() {
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(
        cb, [](nghttp2_session*, const nghttp2_frame* f, const uint8_t* n, size_t nl,
               const uint8_t* v, size_t vl, uint8_t, void* u) {
          static_cast<Client*>(u)
              ->heard[f->hd.stream_id][std::string(reinterpret_cast<const char*>(n), nl)] =
              std::string(reinterpret_cast<const char*>(v), vl);
          return 0;
        });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        cb, [](nghttp2_session*, uint8_t, int32_t id, const uint8_t* d, size_t len, void* u) {
          static_cast<Client*>(u)->data[id].append(reinterpret_cast<const char*>(d), len);
          return 0;
        });
    nghttp2_session_callbacks_set_on_stream_close_callback(
        cb, [](nghttp2_session*, int32_t id, uint32_t code, void* u) {
          static_cast<Client*>(u)->closed[id] = code;
          return 0;
        });
    nghttp2_session_callbacks_set_on_frame_recv_callback(
        cb, [](nghttp2_session*, const nghttp2_frame* f, void* u) {
          if (f->hd.type == NGHTTP2_GOAWAY) static_cast<Client*>(u)->goaway = f->goaway.error_code;
          return 0;
        });
    nghttp2_option* opt = nullptr;
    nghttp2_option_new(&opt);
    nghttp2_option_set_max_send_header_block_length(opt, 1 << 20);  // bombs may leave
    nghttp2_session_client_new2(&s, cb, this, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, nullptr, 0);
  }
  ~Client() { nghttp2_session_del(s); }
  int32_t Request(const H2Headers& extra = {}, bool end = true) {
    H2Headers h = {{":method", "POST"},
                   {":scheme", "http"},
                   {":authority", "r"},
                   {":path", "/inference.GRPCInferenceService/ModelInfer"},
                   {"content-type", "application/grpc"}};
    h.insert(h.end(), extra.begin(), extra.end());
    std::vector<nghttp2_nv> nv = H2Nv(h);
    return nghttp2_submit_headers(s, end ? NGHTTP2_FLAG_END_STREAM : NGHTTP2_FLAG_NONE, -1, nullptr,
                                  nv.data(), nv.size(), nullptr);
  }
  std::string Out() {
    std::string out;
    for (;;) {
      const uint8_t* p = nullptr;
      ssize_t n = nghttp2_session_mem_send(s, &p);
      if (n <= 0) return out;
      out.append(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    }
  }
  void In(const std::string& bytes) {
    nghttp2_session_mem_recv(s, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  nghttp2_session* s = nullptr;
  std::map<int32_t, std::map<std::string, std::string>> heard;
  std::map<int32_t, std::string> data;
  std::map<int32_t, uint32_t> closed;
  int64_t goaway = -1;
};

class H2ServerTest : public ::testing::Test {
 protected:
  void Make(H2Limits limits = {}) {
    server_ = std::make_unique<H2Server>(limits, [this](H2Stream& s) { requests_.push_back(&s); });
  }
  // Client bytes to the server and the server's answer back; false when the
  // server ended the connection.
  bool Exchange() {
    std::string to = client_.Out();
    absl::Status st = server_->Feed(to.data(), to.size());
    std::string back;
    server_->Drain(&back);
    client_.In(back);
    return st.ok();
  }
  Client client_;
  std::unique_ptr<H2Server> server_;
  std::vector<H2Stream*> requests_;
};

TEST_F(H2ServerTest, ACallIsAnsweredWithDataAndTrailers) {
  Make();
  int32_t id = client_.Request({{"x-gpuha-stream", "cam-1"}, {"grpc-timeout", "100m"}});
  ASSERT_TRUE(Exchange());
  ASSERT_EQ(requests_.size(), 1u);
  EXPECT_EQ(requests_[0]->Header("x-gpuha-stream"), "cam-1");
  EXPECT_EQ(requests_[0]->Header(":path"), "/inference.GRPCInferenceService/ModelInfer");
  server_->Respond(id, {{":status", "200"}, {"content-type", "application/grpc"}},
                   std::string("\0\0\0\0\2hi", 7), {{"grpc-status", "0"}});
  ASSERT_TRUE(Exchange());
  EXPECT_EQ(client_.heard[id][":status"], "200");
  EXPECT_EQ(client_.heard[id]["grpc-status"], "0");  // in the trailers
  EXPECT_EQ(client_.data[id], std::string("\0\0\0\0\2hi", 7));
  EXPECT_EQ(client_.closed[id], NGHTTP2_NO_ERROR);
  EXPECT_EQ(server_->open_streams(), 0u);
}

TEST_F(H2ServerTest, ErrorsAreTrailersOnlyWithAnEncodedMessage) {
  Make();
  int32_t id = client_.Request();
  ASSERT_TRUE(Exchange());
  server_->RespondGrpcError(id, GrpcCode::kNotFound, "no such stream: 100% \xff");
  ASSERT_TRUE(Exchange());
  EXPECT_EQ(client_.heard[id]["grpc-status"], "5");
  EXPECT_EQ(client_.heard[id]["grpc-message"], "no such stream: 100%25 %FF");
  EXPECT_EQ(client_.data.count(id), 0u);
  EXPECT_EQ(client_.closed[id], NGHTTP2_NO_ERROR);
}

TEST_F(H2ServerTest, StreamsOverTheConcurrentLimitAreRefused) {
  H2Limits l;
  l.max_concurrent_streams = 4;
  Make(l);
  // Sent before the server's SETTINGS reach the client: all ten go.
  for (int i = 0; i < 10; ++i) client_.Request({}, /*end=*/false);
  Exchange();
  EXPECT_LE(server_->open_streams(), 4u);
  int refused = 0;
  for (auto [id, code] : client_.closed) refused += code == NGHTTP2_REFUSED_STREAM;
  EXPECT_GE(refused, 6);
  EXPECT_TRUE(requests_.empty());  // none ended: none is worked on
}

TEST_F(H2ServerTest, RapidResetEndsTheConnectionAndCancelsTheWork) {
  H2Limits l;
  l.reset_burst = 20;
  l.reset_rate = 1;
  Make(l);
  int cancelled = 0;
  server_ = std::make_unique<H2Server>(l, [&](H2Stream& s) {
    requests_.push_back(&s);
    s.on_close = [&cancelled] { ++cancelled; };
  });
  bool open = true;
  for (int i = 0; i < 200 && open; ++i) {
    int32_t id = client_.Request();
    Exchange();  // the call begins...
    nghttp2_submit_rst_stream(client_.s, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    open = Exchange() && client_.goaway < 0;  // ...and is reset at once
  }
  EXPECT_GE(server_->resets_received(), 20u);
  // nghttp2's token bucket ends the connection (its GOAWAY says INTERNAL_ERROR).
  EXPECT_GT(client_.goaway, NGHTTP2_NO_ERROR);
  EXPECT_LT(requests_.size(), 200u);
  // Every call begun was told its stream went: no work outlives a reset.
  EXPECT_EQ(cancelled, static_cast<int>(requests_.size()));
  EXPECT_EQ(server_->open_streams(), 0u);
}

TEST_F(H2ServerTest, AContinuationFloodEndsTheConnection) {
  Make();
  std::string bytes(kH2Preface);
  bytes += Frame(NGHTTP2_SETTINGS, 0, 0, "");
  bytes += Frame(NGHTTP2_HEADERS, 0, 1, "\x82");  // no END_HEADERS
  for (int i = 0; i < 100; ++i) bytes += Frame(NGHTTP2_CONTINUATION, 0, 1, "\x82");
  absl::Status st = server_->Feed(bytes.data(), bytes.size());
  EXPECT_FALSE(st.ok());
  std::string back;
  server_->Drain(&back);
  client_.In(back);
  EXPECT_GE(client_.goaway, 0);  // a GOAWAY says why
  EXPECT_TRUE(requests_.empty());
}

TEST_F(H2ServerTest, AHeaderListOverTheLimitIsResourceExhausted) {
  H2Limits l;
  l.max_header_list_bytes = 4096;
  Make(l);
  int32_t id = client_.Request({{"x-big", std::string(6000, 'a')}});
  ASSERT_TRUE(Exchange());
  EXPECT_TRUE(requests_.empty());
  ASSERT_TRUE(Exchange());
  EXPECT_EQ(client_.heard[id]["grpc-status"], "8");
  EXPECT_NE(client_.heard[id]["grpc-message"].find("header list over 4096"), std::string::npos);
}

// A REST request (not gRPC) over the limits gets the HTTP answer an HTTP/1.1
// client gets; a gRPC one whose content-type came before the overflow is
// still answered in gRPC (above).
TEST_F(H2ServerTest, ARestRequestOverTheLimitsIsAnsweredInHttp) {
  H2Limits l;
  l.max_header_list_bytes = 4096;
  l.max_request_bytes = 100;
  Make(l);
  int32_t big_head =
      client_.Request({{"x-big", std::string(6000, 'a')}, {"content-type", "application/json"}});
  ASSERT_TRUE(Exchange());
  ASSERT_TRUE(Exchange());
  EXPECT_EQ(client_.heard[big_head][":status"], "431");
  EXPECT_EQ(client_.heard[big_head]["x-gpuha-error"], "header_too_large");
  EXPECT_TRUE(requests_.empty());
}

TEST_F(H2ServerTest, AnHpackBombEndsTheConnection) {
  H2Limits l;
  l.max_header_list_bytes = 4096;
  Make(l);
  // One 3 KB field in the dynamic table, then referenced by index again and
  // again: a few bytes on the wire decode to far over the limit.
  H2Headers bomb;
  for (int i = 0; i < 64; ++i) bomb.emplace_back("x-bomb", std::string(3000, 'b'));
  client_.Request(bomb);
  std::string wire = client_.Out();
  EXPECT_LT(wire.size(), 8000u);  // it is a bomb: small on the wire
  absl::Status st = server_->Feed(wire.data(), wire.size());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(server_->why().find("HPACK bomb"), std::string::npos) << server_->why();
  std::string back;
  server_->Drain(&back);
  client_.In(back);
  EXPECT_EQ(client_.goaway, NGHTTP2_ENHANCE_YOUR_CALM);
  EXPECT_TRUE(requests_.empty());
}

TEST_F(H2ServerTest, ABodyOverTheLimitIsResourceExhausted) {
  H2Limits l;
  l.max_request_bytes = 1000;
  Make(l);
  std::string body(5000, 'x');
  size_t sent = 0;
  nghttp2_data_provider dp;
  dp.source.ptr = nullptr;
  struct Src {
    std::string* body;
    size_t* sent;
  } src{&body, &sent};
  dp.source.ptr = &src;
  dp.read_callback = [](nghttp2_session*, int32_t, uint8_t* buf, size_t len, uint32_t* flags,
                        nghttp2_data_source* source, void*) -> ssize_t {
    auto* s = static_cast<Src*>(source->ptr);
    size_t n = std::min(len, s->body->size() - *s->sent);
    std::memcpy(buf, s->body->data() + *s->sent, n);
    *s->sent += n;
    if (*s->sent == s->body->size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  };
  H2Headers h = {{":method", "POST"},
                 {":scheme", "http"},
                 {":authority", "r"},
                 {":path", "/a.B/C"},
                 {"content-type", "application/grpc"}};
  std::vector<nghttp2_nv> nv = H2Nv(h);
  int32_t id = nghttp2_submit_request(client_.s, nullptr, nv.data(), nv.size(), &dp, nullptr);
  ASSERT_TRUE(Exchange());
  ASSERT_TRUE(Exchange());
  EXPECT_TRUE(requests_.empty());
  EXPECT_EQ(client_.heard[id]["grpc-status"], "8");
  EXPECT_NE(client_.heard[id]["grpc-message"].find("request body over 1000"), std::string::npos);
}

TEST_F(H2ServerTest, BodiesHeldAtOnceAreBoundedPerConnection) {
  H2Limits l;
  l.max_buffered_bytes = 5000;
  Make(l);
  // Requests whose bodies never end, 2000 bytes each: the third is over.
  const std::string block = std::string("\x83\x86\x44\x06") + "/a.B/C" + "\x41\x01" + "r" +
                            "\x5f\x10" + "application/grpc";
  std::string bytes(kH2Preface);
  bytes += Frame(NGHTTP2_SETTINGS, 0, 0, "");
  for (uint32_t id : {1u, 3u, 5u}) {
    bytes += Frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, id, block);
    bytes += Frame(NGHTTP2_DATA, 0, id, std::string(2000, 'x'));
  }
  absl::Status st = server_->Feed(bytes.data(), bytes.size());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(server_->why().find("over 5000 bytes of request bodies held at once"),
            std::string::npos)
      << server_->why();
  std::string back;
  server_->Drain(&back);
  client_.In(back);
  EXPECT_EQ(client_.goaway, NGHTTP2_ENHANCE_YOUR_CALM);
  EXPECT_TRUE(requests_.empty());
}

TEST(GrpcTimeoutTest, ParsesEveryUnitAndNamesABadValue) {
  EXPECT_EQ(*ParseGrpcTimeout("250m"), std::chrono::milliseconds(250));
  EXPECT_EQ(*ParseGrpcTimeout("2S"), std::chrono::milliseconds(2000));
  EXPECT_EQ(*ParseGrpcTimeout("1M"), std::chrono::milliseconds(60000));
  EXPECT_EQ(*ParseGrpcTimeout("1H"), std::chrono::milliseconds(3600000));
  EXPECT_EQ(*ParseGrpcTimeout("1500u"), std::chrono::milliseconds(2));  // rounded up
  EXPECT_EQ(*ParseGrpcTimeout("1n"), std::chrono::milliseconds(1));     // still a deadline
  EXPECT_EQ(*ParseGrpcTimeout("99999999H"), std::chrono::milliseconds(int64_t{99999999} * 3600000));
  for (const char* bad : {"", "m", "5", "123456789m", "12x", "-1m", "1.5S"}) {
    absl::StatusOr<std::chrono::milliseconds> t = ParseGrpcTimeout(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find(absl::StrCat("grpc-timeout: '", bad, "'")),
              std::string::npos)
        << t.status();
  }
  EXPECT_EQ(FormatGrpcTimeout(std::chrono::milliseconds(250)), "250m");
  EXPECT_EQ(FormatGrpcTimeout(std::chrono::milliseconds(-5)), "0m");
  EXPECT_EQ(FormatGrpcTimeout(std::chrono::hours(100)), "360000S");
  EXPECT_EQ(*ParseGrpcTimeout(FormatGrpcTimeout(std::chrono::milliseconds(1234))),
            std::chrono::milliseconds(1234));
}

}  // namespace
}  // namespace gpuha::router
