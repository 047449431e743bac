#include "common/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio.hpp>

#include "common/prometheus.h"

namespace gpuha::common {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<HttpServer> Echo(HttpServer::Options o = {}) {
  auto s = HttpServer::Start(o, [](const HttpRequest& r) {
    HttpResponse out;
    out.body = r.method + " " + r.path + " " + r.body;
    if (r.path == "/missing") out.status = 404;
    return out;
  });
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(HttpServerTest, ServesRequestsOnAnEphemeralPort) {
  auto server = Echo();
  ASSERT_NE(server->port(), 0);
  auto r = HttpCall("POST", "127.0.0.1", server->port(), "/x?y=1", "hi", milliseconds(2000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /x hi");
  auto missing = HttpCall("GET", "127.0.0.1", server->port(), "/missing", "", milliseconds(2000));
  EXPECT_EQ(missing->status, 404);
}

TEST(HttpServerTest, OversizedBodyGets413) {
  HttpServer::Options o;
  o.max_body_bytes = 10;
  auto server = Echo(o);
  auto r =
      HttpCall("POST", "127.0.0.1", server->port(), "/", std::string(100, 'x'), milliseconds(2000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
}

TEST(HttpServerTest, GarbageGets400AndServerKeepsServing) {
  auto server = Echo();
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket sock(io);
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), server->port()});
  std::string junk = "\x16\x03\x01 NOT HTTP\r\n\r\n";
  boost::asio::write(sock, boost::asio::buffer(junk));
  std::string reply(256, '\0');
  boost::system::error_code ec;
  size_t n = sock.read_some(boost::asio::buffer(reply), ec);
  reply.resize(n);
  EXPECT_THAT(reply, ::testing::HasSubstr("400 Bad Request"));
  auto ok = HttpCall("GET", "127.0.0.1", server->port(), "/", "", milliseconds(2000));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->status, 200);
}

TEST(HttpServerTest, UnreachableServerIsAnError) {
  uint16_t port;
  {
    auto server = Echo();
    port = server->port();
  }
  auto r = HttpCall("GET", "127.0.0.1", port, "/", "", milliseconds(500));
  EXPECT_FALSE(r.ok());
}

// Probes keep one connection per server: calls after the first reuse it,
// a server gone and back is reached on a new one, and a server that takes
// the connection but never answers is out of time (not asked twice).
TEST(HttpClientTest, KeepsOneConnectionAndReconnectsWhenItBreaks) {
  auto server = Echo();
  const uint16_t port = server->port();
  HttpClient client("127.0.0.1", port);
  for (int i = 0; i < 5; ++i) {
    auto r = client.Call("GET", "/ready", "", milliseconds(2000));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->body, "GET /ready ");
  }
  EXPECT_EQ(client.connects(), 1);
  auto posted = client.Call("POST", "/x", "hi", milliseconds(2000));
  ASSERT_TRUE(posted.ok()) << posted.status();
  EXPECT_EQ(posted->body, "POST /x hi");
  EXPECT_EQ(client.connects(), 1);

  server.reset();  // its connections close with it
  EXPECT_FALSE(client.Call("GET", "/ready", "", milliseconds(500)).ok());
  HttpServer::Options again;
  again.port = port;
  server = Echo(again);
  auto back = client.Call("GET", "/ready", "", milliseconds(2000));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->status, 200);

  // Listening, never answering: the call runs out of time once.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor mute(
      io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  HttpClient stuck("127.0.0.1", mute.local_endpoint().port());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = stuck.Call("GET", "/ready", "", milliseconds(300));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
  EXPECT_EQ(stuck.connects(), 1);
  EXPECT_THAT(
      std::string(
          HttpClient("no host", 1).Call("GET", "/", "", milliseconds(100)).status().message()),
      ::testing::HasSubstr("bad host 'no host'"));
}

// A probe round: GETs to several servers at once on one Loop, each over
// its client's kept connection; one server gone fails its own call only.
TEST(HttpClientTest, GetAllAsksEveryServerAtOnce) {
  std::vector<std::unique_ptr<HttpServer>> servers;
  for (int i = 0; i < 3; ++i) servers.push_back(Echo());
  HttpClient::Loop loop;
  std::vector<std::unique_ptr<HttpClient>> clients;
  for (const auto& s : servers) {
    clients.push_back(std::make_unique<HttpClient>("127.0.0.1", s->port(), loop));
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<HttpClient::Get> calls;
    for (size_t i = 0; i < clients.size(); ++i) {
      calls.push_back({clients[i].get(), "/ready/" + std::to_string(i)});
    }
    if (round == 2) servers[1].reset();
    HttpClient::GetAll(calls, milliseconds(2000));
    for (size_t i = 0; i < calls.size(); ++i) {
      if (round == 2 && i == 1) {
        EXPECT_FALSE(calls[i].result.ok());
        continue;
      }
      ASSERT_TRUE(calls[i].result.ok()) << i << ": " << calls[i].result.status();
      EXPECT_EQ(calls[i].result->body, "GET /ready/" + std::to_string(i) + " ");
    }
  }
  EXPECT_EQ(clients[0]->connects(), 1);
  EXPECT_EQ(clients[2]->connects(), 1);
  HttpClient other("127.0.0.1", servers[0]->port());  // its own Loop
  std::vector<HttpClient::Get> mixed = {
      {clients[0].get(), "/a"}, {&other, "/b"}, {clients[0].get(), "/c"}};
  HttpClient::GetAll(mixed, milliseconds(2000));
  EXPECT_TRUE(mixed[0].result.ok());
  EXPECT_EQ(mixed[1].result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mixed[2].result.status().message()),
              ::testing::HasSubstr("a client listed twice"));
}

TEST(HttpServerTest, BadListenAddressIsNamed) {
  HttpServer::Options o;
  o.address = "not-an-ip";
  auto s = HttpServer::Start(o, [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("not-an-ip"));
}

TEST(HttpUrlTest, ParsesHostPortAndTarget) {
  auto u = ParseHttpUrl("http://localhost:8001/v2/health/ready");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8001);
  EXPECT_EQ(u->target, "/v2/health/ready");
  EXPECT_FALSE(ParseHttpUrl("https://x/").ok());
  EXPECT_FALSE(ParseHttpUrl("http://x:99999/").ok());
}

TEST(PromTextTest, WritesFamiliesAndEscapedLabels) {
  PromText p;
  p.Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).");
  p.Sample("DCGM_FI_DEV_GPU_TEMP", {{"gpu", "0"}, {"modelName", "NVIDIA \"L4\""}}, 47);
  p.Sample("x", {}, 1.5);
  EXPECT_EQ(p.str(),
            "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
            "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
            "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",modelName=\"NVIDIA \\\"L4\\\"\"} 47\n"
            "x 1.5\n");
}

}  // namespace
}  // namespace gpuha::common
