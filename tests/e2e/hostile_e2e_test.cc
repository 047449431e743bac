// Hostile input against real processes, surface by surface: the router's
// request path, the controller's API, config files, `ctl` flags and the
// agent's fault scripts. Each case is hand-written (the findings of a
// careless operator and an attacker) or a seeded mutation of a good input.
// For every surface the test counts crashes (the process died), hangs (no
// answer and no close in 5 s), lost work (a good request after the bad one
// failed, or admitted state changed) and, for the router, isolation breaches
// (tenant acme's key reaching tenant globex's stream). All must be 0. The
// counts are printed as HOSTILE lines for bench/RESULTS.md.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "cluster/config_builders.h"
#include "common/file_util.h"
#include "common/http_server.h"
#include "common/names.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/free_port.h"
#include "tests/e2e/run_command.h"

namespace gpuha::e2e {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
namespace net = boost::asio;

const std::string kGpuha = GPUHA_BINARY;
const std::string kBackend = GPUHA_TEST_BACKEND;

struct Tally {
  std::string surface;
  int cases = 0, crashes = 0, hangs = 0, lost = 0, breaches = 0;
  void Print() const {
    std::printf("HOSTILE surface=%s cases=%d crashes=%d hangs=%d lost=%d breaches=%d\n",
                surface.c_str(), cases, crashes, hangs, lost, breaches);
    std::fflush(stdout);
  }
  void ExpectClean() const {
    EXPECT_EQ(crashes, 0) << surface;
    EXPECT_EQ(hangs, 0) << surface;
    EXPECT_EQ(lost, 0) << surface;
    EXPECT_EQ(breaches, 0) << surface;
  }
};

struct RawAnswer {
  int status = 0;     // 0: none
  bool hung = false;  // neither an answer nor a close within the timeout
  std::string text;
};

// Writes `bytes` and reads until the peer closes, or one whole answer
// (head and Content-Length body) has come, or 5 s pass.
RawAnswer SendRaw(uint16_t port, const std::string& bytes) {
  RawAnswer a;
  net::io_context ioc;
  net::ip::tcp::socket s(ioc);
  boost::system::error_code ec;
  s.connect({net::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return a;
  struct timeval tv = {5, 0};
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  net::write(s, net::buffer(bytes), ec);
  s.shutdown(net::ip::tcp::socket::shutdown_send, ec);  // nothing more will come
  char buf[8192];
  for (;;) {
    size_t n = s.read_some(net::buffer(buf), ec);
    a.text.append(buf, n);
    if (ec == net::error::eof || ec == net::error::connection_reset) break;
    if (ec) {
      a.hung = a.text.empty();
      break;
    }
  }
  if (a.text.rfind("HTTP/1.1 ", 0) == 0) a.status = std::atoi(a.text.c_str() + 9);
  return a;
}

std::string Mutate(std::string s, std::mt19937& rng) {
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < edits && !s.empty(); ++i) {
    size_t at = rng() % s.size();
    switch (rng() % 4) {
      case 0:
        s[at] = static_cast<char>(rng() % 256);
        break;
      case 1:
        s.insert(at, 1, "\r\n\0 :/%.-_\t"[rng() % 11]);
        break;
      case 2:
        s.erase(at, 1 + rng() % 8);
        break;
      default:
        s.insert(at, s.substr(at, rng() % 16));
    }
  }
  return s;
}

bool Alive(ChildProcess& p) { return ::kill(p.pid(), 0) == 0 && !p.Wait(milliseconds(0)); }

class HostileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = gpuha::testing::TestTempDir(); }
  std::filesystem::path dir_;
};

TEST_F(HostileTest, RouterRequestPath) {
  std::vector<std::unique_ptr<ChildProcess>> backends;
  std::vector<std::string> addr;
  for (const char* name : {"a", "b"}) {
    backends.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{kBackend, "--name", name, "--port", "0"}));
    auto p = backends.back()->WaitForLine("listening on 127.0.0.1:", milliseconds(10000));
    ASSERT_TRUE(p.has_value());
    addr.push_back("127.0.0.1:" + *p);
  }
  cluster::RouterYaml r;
  r.tenants = {{.name = "acme", .api_keys = {"k1"}}, {.name = "globex", .api_keys = {"k2"}}};
  r.routes = {{.stream = "s1", .tenant = "acme", .primary = addr[0], .standby = addr[1]},
              {.stream = "s2", .tenant = "globex", .primary = addr[1], .standby = addr[0]}};
  std::ofstream(dir_ / "router.yaml")
      << r.Yaml() << "limits: { header_timeout_ms: 1000, max_header_bytes: 8192 }\n";
  ChildProcess router({kGpuha, "router", "--config", (dir_ / "router.yaml").string(), "--listen",
                       "127.0.0.1:0", "--admin", "127.0.0.1:0", "--threads", "2"});
  auto rest = router.WaitForLine("gpuha router listening on 127.0.0.1:", milliseconds(10000));
  ASSERT_TRUE(rest.has_value()) << router.err();
  const auto port = static_cast<uint16_t>(std::stoi(*rest));
  const std::string good =
      "GET /streams/s1/v2/models/m HTTP/1.1\r\nHost: r\r\nX-Api-Key: k1\r\n\r\n";
  ASSERT_EQ(SendRaw(port, good).status, 200);

  const std::string h = "Host: r\r\nX-Api-Key: k1\r\n";
  std::vector<std::string> cases = {
      // Transfer codings and lengths (smuggling).
      "POST /streams/s1/x HTTP/1.1\r\n" + h +
          "Transfer-Encoding: gzip\r\n\r\nGET /streams/s2/x HTTP/1.1\r\nHost: r\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Transfer-Encoding: identity\r\n\r\nabc",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, identity\r\n\r\nabc",
      "POST /streams/s1/x HTTP/1.1\r\n" + h +
          "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Transfer-Encoding:  chunked\x0b\r\n\r\n0\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h +
          "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 5\r\n\r\nabc",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Content-Length: -1\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Content-Length: 1 0\r\n\r\n0123456789",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Content-Length: 99999999999999999999\r\n\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h +
          "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\nabc\r\n",
      "POST /streams/s1/x HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef",
      // Path spellings of another tenant's stream.
      "GET //streams/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /./streams/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/s1/../s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/s1/../../streams/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/s1/%2e%2e/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /%73treams/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /Streams/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET http://r/streams/s2/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/s2%2fx HTTP/1.1\r\n" + h + "\r\n",
      "GET /x HTTP/1.1\r\n" + h + "X-Gpuha-Stream: s2\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\n" + h + "X-Gpuha-Stream: s2\r\n\r\n",
      "GET /../x HTTP/1.1\r\n" + h + "\r\n",
      "GET /%zz HTTP/1.1\r\n" + h + "\r\n",
      "GET * HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/" + std::string(300, 'a') + "/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/a b/x HTTP/1.1\r\n" + h + "\r\n",
      std::string("GET /streams/s1\0/x HTTP/1.1\r\n", 29) + h + "\r\n",
      "GET /" + std::string(20000, 'p') + " HTTP/1.1\r\n" + h + "\r\n",
      // Methods and versions.
      "CONNECT r:443 HTTP/1.1\r\n" + h + "\r\n",
      "OPTIONS * HTTP/1.1\r\n" + h + "\r\n",
      "FOO /streams/s1/x HTTP/1.1\r\n" + h + "\r\n",
      "get /streams/s1/x HTTP/1.1\r\n" + h + "\r\n",
      "GET /streams/s1/x HTTP/9.9\r\n" + h + "\r\n",
      "GET /streams/s1/x\r\n\r\n",
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
      std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),
      // Headers.
      "GET /streams/s1/x HTTP/1.1\r\nX-Api-Key: k1\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\nHost: a\r\nHost: b\r\nX-Api-Key: k1\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\n" + h + "NoColon\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\n" + h + "X-Big: " + std::string(9000, 'b') + "\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\n" + h + " folded: line\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\nHost: r\nX-Api-Key: k1\n\n",
      std::string("GET /streams/s1/x HTTP/1.1\r\nHost: r\r\nX-Api-Key: k\0 1\r\n\r\n", 56),
      "GET /streams/s2/x HTTP/1.1\r\nHost: r\r\nX_Api_Key: k2\r\nX-Api-Key: k1\r\n\r\n",
      "GET /streams/s2/x HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer k1\r\n\r\n",
      "GET /streams/s2/x HTTP/1.1\r\nHost: r\r\nAuthorization: Basic azI=\r\nX-Api-Key: k1\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\nHost: r\r\nX-Api-Key: " + std::string(5000, 'k') + "\r\n\r\n",
      "GET /streams/s1/x HTTP/1.1\r\n" + h + "X-Gpuha-Tenant: globex\r\n\r\n",
      // Incomplete heads: the header timeout closes them.
      "GET /streams/s1/x HTTP/1.1\r\nHost: r\r\n",
      "G",
  };
  std::string many = "GET /streams/s1/x HTTP/1.1\r\n" + h;
  for (int i = 0; i < 150; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  cases.push_back(many + "\r\n");
  std::mt19937 rng(20261201);
  const std::string post =
      "POST /streams/s1/v2/models/m/infer HTTP/1.1\r\nHost: r\r\nX-Api-Key: k1\r\n"
      "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
  for (int i = 0; i < 300; ++i) cases.push_back(Mutate(i % 2 ? good : post, rng));

  Tally t{"router request path"};
  for (const std::string& c : cases) {
    ++t.cases;
    RawAnswer a = SendRaw(port, c);
    if (a.hung) ++t.hangs;
    // Tenant acme's key must never reach globex's stream.
    if (a.status / 100 == 2 && (a.text.find(R"("stream":"s2")") != std::string::npos ||
                                a.text.find(R"("tenant":"globex")") != std::string::npos)) {
      ++t.breaches;
      ADD_FAILURE() << "breach: " << c.substr(0, 200) << "\n" << a.text.substr(0, 400);
    }
    if (SendRaw(port, good).status != 200) {
      ++t.lost;
      ADD_FAILURE() << "a good request failed after: " << c.substr(0, 200);
    }
  }
  if (!Alive(router)) ++t.crashes;
  t.Print();
  t.ExpectClean();
}

// HTTP/2 by hand: frames (RFC 9113 4.1) and HPACK literals (RFC 7541 6.2),
// so that an attack can say what no well-behaved client library would.
std::string H2Frame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload) {
  const auto len = static_cast<uint32_t>(payload.size());
  std::string f = {static_cast<char>(len >> 16),    static_cast<char>(len >> 8),
                   static_cast<char>(len),          static_cast<char>(type),
                   static_cast<char>(flags),        static_cast<char>((stream >> 24) & 0x7f),
                   static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                   static_cast<char>(stream)};
  return f.append(payload);
}
constexpr uint8_t kHeaders = 1, kRstStream = 3, kSettings = 4, kContinuation = 9;
constexpr uint8_t kEndStream = 1, kEndHeaders = 4;
// GOAWAY codes. nghttp2's RST_STREAM rate limit (the rapid-reset defence)
// ends a session with INTERNAL_ERROR.
constexpr uint32_t kInternalError = 2, kCompressionError = 9, kEnhanceYourCalm = 11;
std::string HpackInt(uint64_t v, int prefix_bits, uint8_t first) {
  const uint64_t max = (uint64_t{1} << prefix_bits) - 1;
  if (v < max) return std::string(1, static_cast<char>(first | v));
  std::string out(1, static_cast<char>(first | max));
  for (v -= max; v >= 128; v /= 128) out += static_cast<char>(v % 128 + 128);
  return out + static_cast<char>(v);
}
// A literal field with a new name; `index`: added to the dynamic table.
std::string HpackLiteral(std::string_view name, std::string_view value, bool index = false) {
  return HpackInt(0, 6, index ? 0x40 : 0x00) + HpackInt(name.size(), 7, 0) + std::string(name) +
         HpackInt(value.size(), 7, 0) + std::string(value);
}
// A call's header block for tenant acme's stream cam-0: ModelInfer, or
// ModelStreamInfer (worked on from its headers, before any body).
std::string GrpcHeaderBlock(const char* method = "ModelInfer") {
  const std::string path = absl::StrCat("/inference.GRPCInferenceService/", method);
  std::string b;
  for (auto [n, v] : {std::pair{":method", "POST"}, std::pair{":scheme", "http"},
                      std::pair{":path", path.c_str()}, std::pair{":authority", "r"},
                      std::pair{"content-type", "application/grpc"}, std::pair{"te", "trailers"},
                      std::pair{"x-api-key", "k1"}, std::pair{"x-gpuha-stream", "cam-0"}}) {
    b += HpackLiteral(n, v);
  }
  return b;
}
// The client's connection preface (h2c, prior knowledge) and its SETTINGS.
std::string H2Open() {
  return std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + H2Frame(kSettings, 0, 0, "");
}

// An attacker's connection: what it sends, and then whether the router
// ended it (GOAWAY or a close) within 5 s.
struct H2Attack {
  bool connected = false, ended = false, goaway = false;
  uint32_t goaway_code = 0;
  size_t refused = 0;  // RST_STREAM REFUSED_STREAM from the router
};
// Sends `bytes`, then reads frames until the router closes, or `hold` says
// to stop (for a connection kept open while the good clients are checked).
class H2Conn {
 public:
  explicit H2Conn(uint16_t port) : s_(ioc_) {
    boost::system::error_code ec;
    s_.connect({net::ip::make_address("127.0.0.1"), port}, ec);
    a_.connected = !ec;
  }
  // False once the router stopped taking bytes: it ended the connection, or
  // took nothing for a second (what it did not take is given up).
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      pollfd p = {s_.native_handle(), POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) return false;
      const ssize_t n = ::send(s_.native_handle(), bytes.data() + sent, bytes.size() - sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until the router ends the connection or `ms` pass without a byte.
  H2Attack Read(int ms = 5000) {
    char buf[16384];
    for (;;) {
      pollfd p = {s_.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, ms) <= 0) break;  // quiet: still open
      const ssize_t n = ::recv(s_.native_handle(), buf, sizeof buf, 0);
      if (n <= 0) {  // closed (0) or reset
        a_.ended = true;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
      Parse();
    }
    return a_;
  }

 private:
  void Parse() {
    while (in_.size() >= 9) {
      const auto* p = reinterpret_cast<const unsigned char*>(in_.data());
      const size_t len = (size_t{p[0]} << 16) | (size_t{p[1]} << 8) | p[2];
      if (in_.size() < 9 + len) return;
      if (p[3] == 7 && len >= 8) {  // GOAWAY
        a_.goaway = true;
        a_.goaway_code =
            (uint32_t{p[13]} << 24) | (uint32_t{p[14]} << 16) | (uint32_t{p[15]} << 8) | p[16];
      }
      if (p[3] == kRstStream && len == 4 && p[12] == 7) ++a_.refused;  // REFUSED_STREAM
      in_.erase(0, 9 + len);
    }
  }
  net::io_context ioc_;
  net::ip::tcp::socket s_;
  std::string in_;
  H2Attack a_;
};

long RssKb(pid_t pid, const char* field) {
  auto text = common::ReadFile("/proc/" + std::to_string(pid) + "/status");
  if (!text.ok()) return -1;
  size_t at = text->find(field);
  return at == std::string::npos ? -1 : std::atol(text->c_str() + at + std::strlen(field) + 1);
}

TEST_F(HostileTest, RouterHttp2Attacks) {
  // Two workers' gRPC ports behind a router process; good gRPC clients
  // (unary calls and streams, every answer checked) run through every
  // attack, each from a connection of its own.
  std::vector<std::unique_ptr<ChildProcess>> workers;
  std::vector<std::string> http, grpc;
  for (const char* name : {"a", "b"}) {
    http.push_back(absl::StrCat("127.0.0.1:", FreePort()));
    grpc.push_back(absl::StrCat("127.0.0.1:", FreePort()));
    workers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{kGpuha, "worker", "--listen", http.back(), "--grpc-listen",
                                 grpc.back(), "--node", name, "--latency", "2"}));
  }
  cluster::RouterYaml r;
  r.tenants = {{.name = "acme", .api_keys = {"k1"}}};
  r.routes = {{.stream = "cam-0",
               .tenant = "acme",
               .primary = http[0],
               .standby = http[1],
               .primary_grpc = grpc[0],
               .standby_grpc = grpc[1]}};
  std::ofstream(dir_ / "router.yaml") << r.Yaml();
  const uint16_t admin = FreePort();
  ChildProcess router({kGpuha, "router", "--config", (dir_ / "router.yaml").string(), "--listen",
                       "127.0.0.1:0", "--admin", absl::StrCat("127.0.0.1:", admin), "--threads",
                       "2"});
  auto listening = router.WaitForLine("gpuha router listening on 127.0.0.1:", milliseconds(10000));
  ASSERT_TRUE(listening.has_value()) << router.err();
  const auto port = static_cast<uint16_t>(std::stoi(*listening));
  const std::string target = absl::StrCat("127.0.0.1:", port);
  // The good clients answer before any attack.
  auto good = [&](const char* protocol, int seconds, const char* report) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        kGpuha, "load", "--target", target, "--protocol", protocol, "--streams", "1", "--rate",
        "100", "--seconds", std::to_string(seconds), "--key", "k1", "--quiet", "--json",
        (dir_ / report).string()});
  };
  ASSERT_TRUE(gpuha::testing::Eventually(
      [&] { return good("grpc", 1, "first.json")->Wait(milliseconds(10000)) == 0; },
      milliseconds(15000)));
  const long rss_before = RssKb(router.pid(), "VmRSS:");
  auto unary = good("grpc", 12, "grpc.json");
  auto streams = good("grpc-stream", 12, "grpc-stream.json");

  Tally t{"router http/2"};
  // Each attack on connections of its own; `conns` at once.
  // `goaway`: the code each connection must be ended with.
  auto attack = [&](const std::string& name, int conns, uint32_t goaway,
                    const std::function<std::string(int)>& bytes) {
    const auto began = std::chrono::steady_clock::now();
    std::vector<std::unique_ptr<H2Conn>> open;
    for (int c = 0; c < conns; ++c) {
      open.push_back(std::make_unique<H2Conn>(port));
      open.back()->Send(H2Open() + bytes(c));
    }
    int ended = 0;
    for (auto& c : open) {
      ++t.cases;
      H2Attack a = c->Read();
      ended += a.ended;
      if (!a.ended) ++t.hangs;
      // Ended by the defence meant for it, not by some other error.
      EXPECT_TRUE(a.goaway) << name;
      EXPECT_EQ(a.goaway_code, goaway) << name;
    }
    std::printf("HOSTILE h2 attack=%s connections=%d ended=%d in %.0f ms\n", name.c_str(), conns,
                ended,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began)
                    .count());
  };
  // Rapid reset (CVE-2023-44487): streams opened and reset at once, 5,000
  // per connection.
  // Unary calls wait for their body; streaming calls are worked on (routed,
  // sent upstream) from their headers, so each reset cancels real work.
  for (const char* method : {"ModelInfer", "ModelStreamInfer"}) {
    attack(absl::StrCat("rapid-reset ", method), 4, kInternalError, [method](int) {
      std::string b;
      const std::string block = GrpcHeaderBlock(method);
      for (uint32_t id = 1; id < 10000; id += 2) {
        b += H2Frame(kHeaders, kEndHeaders, id, block);
        b += H2Frame(kRstStream, 0, id, std::string("\0\0\0\x08", 4));  // CANCEL
      }
      return b;
    });
  }
  // A CONTINUATION flood: one header block that never ends, 1 MiB a connection.
  attack("continuation-flood", 8, kEnhanceYourCalm, [](int) {
    std::string b = H2Frame(kHeaders, 0, 1, GrpcHeaderBlock());
    for (int i = 0; i < 256; ++i) {
      b += H2Frame(kContinuation, 0, 1, HpackLiteral("x-junk", std::string(4000, 'j')));
    }
    return b;
  });
  // An oversized HPACK table: a dynamic table size update past the 4,096
  // bytes the router allows...
  attack("hpack-table-size", 4, kCompressionError, [](int) {
    return H2Frame(kHeaders, kEndHeaders | kEndStream, 1,
                   HpackInt(uint64_t{1} << 30, 5, 0x20) + GrpcHeaderBlock());
  });
  // ...and an HPACK bomb: one 4,000-byte field in the table, referenced
  // 4,000 times (1 byte each), 16 MB of header list from 8 KB on the wire.
  attack("hpack-bomb", 4, kEnhanceYourCalm, [](int) {
    std::string block = GrpcHeaderBlock() + HpackLiteral("x-bomb", std::string(4000, 'b'), true);
    for (int i = 0; i < 4000; ++i) block += static_cast<char>(0x80 | 62);  // dynamic entry 1
    std::string b;
    for (size_t at = 0, id = 0; at < block.size(); at += 16384, ++id) {
      const bool last = at + 16384 >= block.size();
      b += H2Frame(id == 0 ? kHeaders : kContinuation,
                   (last ? kEndHeaders : 0) | (id == 0 ? kEndStream : 0), 1,
                   block.substr(at, 16384));
    }
    return b;
  });
  // Stream-count exhaustion: 60 connections, each opening 1,000 calls that
  // never send their body, held open while the good clients go on.
  {
    std::vector<std::unique_ptr<H2Conn>> held;
    size_t refused = 0;
    for (int c = 0; c < 60; ++c) {
      held.push_back(std::make_unique<H2Conn>(port));
      std::string b = H2Open();
      const std::string block = GrpcHeaderBlock();
      for (uint32_t id = 1; id < 2000; id += 2) b += H2Frame(kHeaders, kEndHeaders, id, block);
      held.back()->Send(b);
    }
    // A new client is served while they are held...
    auto during = good("grpc", 2, "during.json");
    EXPECT_EQ(during->Wait(milliseconds(15000)), 0) << during->out() << during->err();
    // ...and past the concurrent-stream limit each call was refused, not held.
    for (auto& c : held) {
      ++t.cases;
      refused += c->Read(100).refused;
    }
    std::printf("HOSTILE h2 attack=stream-exhaustion connections=60 streams_refused=%zu\n",
                refused);
    EXPECT_GE(refused, size_t{60 * (1000 - 128)});
  }
  const long rss_peak = RssKb(router.pid(), "VmHWM:");
  EXPECT_EQ(unary->Wait(milliseconds(40000)), 0) << unary->out() << unary->err();
  EXPECT_EQ(streams->Wait(milliseconds(40000)), 0) << streams->out() << streams->err();
  for (const char* protocol : {"grpc", "grpc-stream"}) {
    auto report = common::ReadFile((dir_ / absl::StrCat(protocol, ".json")).string());
    ASSERT_TRUE(report.ok()) << protocol;
    json j = json::parse(*report);
    std::printf("HOSTILE h2 good clients=%s ok=%d failed=%d\n", protocol, j["ok"].get<int>(),
                j["failed"].get<int>());
    if (j["failed"].get<int>() != 0) ++t.lost;
    EXPECT_GT(j["ok"].get<int>(), 1000) << protocol << ": " << j.dump();
  }
  if (!Alive(router)) ++t.crashes;
  // Memory stays bounded: what every attack held at once stays under 256 MiB.
  std::printf("HOSTILE h2 router_rss_kb before=%ld peak=%ld\n", rss_before, rss_peak);
  EXPECT_LT(rss_peak - rss_before, 256 * 1024)
      << "router RSS grew from " << rss_before << " kB to a peak of " << rss_peak << " kB";
  auto metrics = common::HttpCall("GET", "127.0.0.1", admin, "/metrics", "", milliseconds(2000));
  ASSERT_TRUE(metrics.ok());
  auto metric = [&](const std::string& name) {
    size_t at = metrics->body.find(absl::StrCat("\n", name, " "));
    return at == std::string::npos ? -1.0 : std::stod(metrics->body.substr(at + name.size() + 2));
  };
  const double resets = metric("gpuha_router_h2_resets_total");
  const double protocol_errors = metric("gpuha_router_h2_protocol_errors_total");
  std::printf("HOSTILE h2 resets_taken=%.0f protocol_errors=%.0f\n", resets, protocol_errors);
  // Each rapid-reset connection was cut by the reset limit (a burst of 200,
  // then 100/s), well before its 5,000 resets.
  EXPECT_GE(resets, 8 * 200) << metrics->body;
  EXPECT_LT(resets, 8 * 1000) << metrics->body;
  t.Print();
  t.ExpectClean();
}

TEST_F(HostileTest, ControllerApiAndAgentFaultScripts) {
  const uint16_t grpc = FreePort(), http = FreePort();
  cluster::ControllerYaml c;
  c.nodes = {{.name = "n1", .capacity = 4, .address = "127.0.0.1:9001"},
             {.name = "n2", .role = "passive", .capacity = 4, .address = "127.0.0.1:9002"}};
  c.tenants = {"acme"};
  c.grpc_listen = "127.0.0.1:" + std::to_string(grpc);
  c.http_listen = "127.0.0.1:" + std::to_string(http);
  c.store_path = (dir_ / "c.db").string();
  std::ofstream(dir_ / "controller.yaml") << c.Yaml();
  ChildProcess controller({kGpuha, "controller", "--config", (dir_ / "controller.yaml").string()});
  ASSERT_TRUE(controller.WaitForLine("gpuha controller grpc", milliseconds(10000)))
      << controller.err();
  auto call = [&](const std::string& method, const std::string& target, const std::string& body) {
    return common::HttpCall(method, "127.0.0.1", http, target, body, milliseconds(5000));
  };
  // Both nodes join (agents connected, servers ready) before a stream can
  // be placed; n1's agent serves the fault-script part below.
  auto start_agent = [&](const char* node) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        kGpuha, "agent", "--node", node, "--controller", "127.0.0.1:" + std::to_string(grpc),
        "--gpu", "sim", "--listen", "127.0.0.1:0"});
  };
  std::unique_ptr<ChildProcess> agent = start_agent("n1"), agent2 = start_agent("n2");
  auto port = agent->WaitForLine("listening on 127.0.0.1:", milliseconds(10000));
  ASSERT_TRUE(port.has_value()) << agent->err();
  const auto agent_port = static_cast<uint16_t>(std::stoi(*port));
  ASSERT_TRUE(gpuha::testing::Eventually(
      [&] {
        auto r = call("GET", "/api/v1/nodes", "");
        if (!r.ok()) return false;
        int serving = 0;
        for (const json& n : json::parse(r->body, nullptr, false)) {
          serving += n.value("lifecycle", "") == "serving";
        }
        return serving == 2;
      },
      milliseconds(10000)));
  ASSERT_EQ(call("POST", "/api/v1/streams", R"({"id":"cam-1","tenant":"acme"})")->status, 201);

  const std::string kNul("\0", 1);
  std::vector<std::pair<std::string, std::string>> bodies = {
      {"POST", R"({"id":"victim\u0000evil","tenant":"acme"})"},
      {"POST", R"({"id":"a/b","tenant":"acme"})"},
      {"POST", R"({"id":"a b","tenant":"acme"})"},
      {"POST", R"({"id":"a\nb","tenant":"acme"})"},
      {"POST", json{{"id", std::string(100000, 'x')}, {"tenant", "acme"}}.dump()},
      {"POST", R"({"id":"","tenant":"acme"})"},
      {"POST", R"({"id":"x","tenant":"globex"})"},
      {"POST", R"({"id":"x","tenant":"ac\u0000me"})"},
      {"POST", R"({"id":7,"tenant":"acme"})"},
      {"POST", R"({"id":"x","tenant":["acme"]})"},
      {"POST", R"({"id":"x","tenant":"acme","weight":-1})"},
      {"POST", R"({"id":"x","tenant":"acme","weight":1e300})"},
      {"POST", R"({"id":"x","tenant":"acme","weight":9223372036854775807})"},
      {"POST", R"({"id":"x","tenant":"acme","weight":"1"})"},
      {"POST", R"({"id":"x","tenant":"acme","extra":1})"},
      {"POST", R"([{"id":"x","tenant":"acme"}])"},
      {"POST", R"({"id":"x","tenant":"acme")"},
      {"POST", "null"},
      {"POST", ""},
      {"POST", std::string(1 << 20, '{')},
      {"POST", "{\"id\":\"x\"" + kNul + ",\"tenant\":\"acme\"}"},
      {"POST", R"({"id":"cam-1","tenant":"acme"})"},  // already there: 409
  };
  std::mt19937 rng(1201);
  for (int i = 0; i < 200; ++i) {
    bodies.push_back({"POST", Mutate(R"({"id":"cam-9","tenant":"acme","weight":2})", rng)});
  }
  Tally t{"controller API"};
  for (const auto& [method, body] : bodies) {
    ++t.cases;
    auto r = call(method, "/api/v1/streams", body);
    if (!r.ok()) {
      ++t.hangs;
      ADD_FAILURE() << "no answer to " << body.substr(0, 120) << ": " << r.status();
    } else if (r->status >= 500) {
      ++t.lost;
      ADD_FAILURE() << r->status << " for " << body.substr(0, 120) << ": " << r->body;
    }
  }
  for (const char* target :
       {"/api/v1/nodes/..%2f..%2fetc", "/api/v1/streams/a%00b", "/api/v1/nodes/n1/drain?force=x",
        "/api/v1/events?after=-1", "/api/v1/events?after=abc", "/api/v1/nodes/n1/role",
        "/api/v1/streams/%zz"}) {
    for (const char* method : {"GET", "POST", "DELETE", "PUT"}) {
      ++t.cases;
      auto r = call(method, target, "{");
      if (!r.ok()) ++t.hangs;
      if (r.ok() && r->status >= 500) ++t.lost;
    }
  }
  // Nothing admitted is lost, and nothing admitted breaks the ID rule.
  auto streams = json::parse(call("GET", "/api/v1/streams", "")->body, nullptr, false);
  bool cam1 = false;
  for (const json& s : streams) {
    std::string id = s.value("id", "");
    cam1 = cam1 || id == "cam-1";
    if (!common::ValidStreamId(id) || s.value("tenant", "") != "acme") {
      ++t.breaches;
      ADD_FAILURE() << "admitted: " << s.dump();
    }
  }
  if (!cam1) ++t.lost;
  if (!Alive(controller)) ++t.crashes;
  t.Print();
  t.ExpectClean();

  // The agent's fault scripts (its /v1/sim/faults endpoint).
  std::vector<std::string> specs = {"kind=xid,xid=4242",
                                    "gpu=9,kind=xid,xid=79",
                                    "kind=nope",
                                    "gpu=-1,kind=xid,xid=79",
                                    "kind=temp_ramp,to_c=1e999,over_ms=1",
                                    "kind=temp_ramp,to_c=95,over_ms=-5",
                                    "",
                                    "kind",
                                    "=,=,=",
                                    "gpu=0,kind=xid,xid=79,xid=48",
                                    std::string(100000, ','),
                                    "gpu=99999999999999999999,kind=xid,xid=79",
                                    "kind=xid,xid=79,unknown=1",
                                    std::string("kind=xid\0,xid=79", 16)};
  for (int i = 0; i < 100; ++i)
    specs.push_back(Mutate("gpu=0,kind=temp_ramp,to_c=95,over_ms=600", rng));
  Tally f{"agent fault scripts"};
  for (const std::string& spec : specs) {
    ++f.cases;
    auto r = common::HttpCall("POST", "127.0.0.1", agent_port, "/v1/sim/faults", spec,
                              milliseconds(5000));
    if (!r.ok()) ++f.hangs;
    if (r.ok() && r->status >= 500) ++f.lost;
  }
  if (!Alive(*agent)) ++f.crashes;
  f.Print();
  f.ExpectClean();
}

// Config files and command-line flags: every bad one exits 2 with a message
// naming the field (or flag), never a crash or a hang.
TEST_F(HostileTest, ConfigFilesAndFlags) {
  const std::string nodes2 = "nodes: [{ name: a, capacity: 1 }, { name: b, capacity: 1 }]\n";
  const std::string hash = common::Sha256Hex("k");
  struct Case {
    std::string component, yaml, expect;
  };
  std::vector<Case> cases = {
      {"router", "", "tenants"},
      {"router", "listen: nowhere\nauth: none\n", "listen"},
      {"router", "auth: none\nlimits: {max_header_bytes: 4294967296}\n", "max_header_bytes"},
      {"router", "auth: none\nlimits: {header_timeout_ms: 9223372036854775807}\n",
       "header_timeout_ms"},
      {"router", "tenants: [{name: a, api_keys_sha256: [" + hash + "], burst: 1e300}]\n", "burst"},
      {"router",
       "tenants: [{name: a, api_keys_sha256: [" + hash + "], requests_per_second: 1e-12}]\n",
       "requests_per_second"},
      {"router", "auth: none\nthreads: 100000\n", "threads"},
      {"router", "auth: maybe\n", "auth"},
      {"router", "tenants: [oops", "not valid YAML"},
      {"router", "auth: none\n---\nauth: none\n", "second YAML document"},
      {"router", "auth: none\nroutes: [{stream: \"a/b\", primary: \"127.0.0.1:1\"}]\n", "stream"},
      {"router", "auth: none\nfailover: {probe_interval_ms: -1}\n", "probe_interval_ms"},
      {"router", "auth: none\ntls: {cert: a.pem}\n", "tls.key"},
      {"controller", "", "nodes"},
      {"controller", nodes2 + "cluster: { redundancy: -1 }\n", "redundancy"},
      {"controller",
       "nodes: [{ name: a, capacity: 9223372036854775807 }, { name: b, capacity: 1 }]\n",
       "capacity"},
      {"controller", "nodes: [{ name: rack1/n1, capacity: 1 }, { name: b, capacity: 1 }]\n",
       "name"},
      {"controller", "nodes: [{ name: a, capacity: 1, address: x }, { name: b, capacity: 1 }]\n",
       "address"},
      {"controller", nodes2 + "startup_grace_ms: 9223372036854775807\n", "startup_grace_ms"},
      {"controller", nodes2 + "recovery: { window_s: 9223372036854775807 }\n", "window_s"},
      {"controller", nodes2 + "listen: { grpc: nowhere }\n", "listen.grpc"},
      {"controller",
       nodes2 + "tokens: [{name: a, role: viewer, sha256: " + hash +
           "}, {name: b, role: admin, "
           "sha256: " +
           hash + "}]\n",
       "already listed"},
      {"controller", nodes2 + "---\n" + nodes2, "second YAML document"},
      {"controller", nodes2 + "tenants: [\"a b\"]\n", "tenants"},
      {"controller", nodes2 + "detector: { k: -1 }\n", "detector.k"},
      {"agent", "node: \"a/b\"\ncontrollers: [\"127.0.0.1:1\"]\ngpu: { backend: sim }\n", "node"},
      {"agent", "node: a\ncontrollers: [nowhere]\ngpu: { backend: sim }\n", "controllers"},
      {"agent", "node: a\ncontrollers: [\"127.0.0.1:1\"]\ngpu: { backend: cuda }\n", "backend"},
      {"agent", "node: a\ncontrollers: [\"127.0.0.1:1\"]\ngpu: { backend: sim }\ntls: {key: k}\n",
       "tls.cert"},
  };
  Tally t{"config files"};
  int i = 0;
  for (const Case& k : cases) {
    ++t.cases;
    std::string path = (dir_ / ("c" + std::to_string(i++) + ".yaml")).string();
    std::ofstream(path) << k.yaml;
    ChildProcess p({kGpuha, k.component, "--config", path});
    std::optional<int> code = p.Wait(milliseconds(10000));
    if (!code) {
      ++t.hangs;
      p.Signal(SIGKILL);
    } else if (*code >= 128) {
      ++t.crashes;
    }
    EXPECT_EQ(code.value_or(-1), 2) << k.component << ": " << k.yaml << "\n" << p.err();
    EXPECT_THAT(p.err(), ::testing::HasSubstr(k.expect)) << k.component << ": " << k.yaml;
  }
  // A directory as the config.
  for (const char* component : {"router", "controller", "agent"}) {
    ++t.cases;
    ChildProcess p({kGpuha, component, "--config", dir_.string()});
    std::optional<int> code = p.Wait(milliseconds(10000));
    if (!code) ++t.hangs;
    if (code && *code >= 128) ++t.crashes;
    EXPECT_EQ(code.value_or(-1), 2) << component << p.err();
    EXPECT_THAT(p.err(), ::testing::HasSubstr("is a directory")) << component;
  }
  t.Print();
  t.ExpectClean();

  Tally f{"command-line flags"};
  for (const std::string& args :
       {std::string("router --config /nonexistent.yaml"), std::string("router --threads x"),
        std::string("controller --config"), std::string("controller --grpc-listen :"),
        std::string("agent --node \"a b\" --controller 127.0.0.1:1 --gpu sim"),
        std::string("agent --node a --controller nowhere --gpu sim"),
        std::string("ctl --controller ftp://x nodes"),
        std::string("ctl --controller http://[::1 nodes"),
        std::string("ctl --token \"$(printf 'a\\r\\nB: c')\" nodes"),
        std::string("ctl add-stream \"x/y\" --tenant acme"), std::string("ctl --weight 0 nodes"),
        std::string("demo --faults nosuchfault"), std::string("demo --streams 0"),
        std::string("demo --faults mig-lost"), std::string("demo --mig-per-gpu 9"),
        std::string("agent --node a --controller 127.0.0.1:1 --gpu sim --sim-mig 8"),
        std::string("plan --nosuchflag"), std::string("load --rate -5")}) {
    ++f.cases;
    CommandResult r = RunCommand(kGpuha + " " + args);
    if (r.exit_code == 124) ++f.hangs;  // timeout(1)
    if (r.exit_code < 0 || r.exit_code >= 128) ++f.crashes;
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << args << ": " << r.exit_code << r.err;
    EXPECT_FALSE(r.err.empty()) << args;
  }
  f.Print();
  f.ExpectClean();
}

}  // namespace
}  // namespace gpuha::e2e
