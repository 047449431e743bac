#include "common/listen.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <mutex>
#include <set>
#include <thread>

namespace gpuha::common {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// Connects, reads what the server wrote until it closes; "" when refused.
std::string Fetch(uint16_t port) {
  net::io_context ioc;
  tcp::socket s(ioc);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return "";
  std::string out;
  char buf[64];
  for (;;) {
    size_t n = s.read_some(net::buffer(buf), ec);
    out.append(buf, n);
    if (ec) return out;
  }
}

TEST(LoopServerTest, EveryConnectionIsServedOnSomeLoopAndStopEndsIt) {
  std::atomic<int> served{0};
  std::set<std::thread::id> threads;
  std::mutex mu;
  auto server = LoopServer::Start("127.0.0.1", 0, 2, [&](tcp::socket s) -> net::awaitable<void> {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    served++;
    co_await net::async_write(s, net::buffer("hi", 2), net::use_awaitable);
  });
  ASSERT_TRUE(server.ok()) << server.status();
  uint16_t port = (*server)->port();
  ASSERT_GT(port, 0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Fetch(port), "hi");
  EXPECT_EQ(served.load(), 20);
  EXPECT_GE(threads.size(), 1u);
  EXPECT_LE(threads.size(), 2u);
  (*server)->Stop();
  server->reset();
  EXPECT_EQ(Fetch(port), "");  // nobody listens any more
}

TEST(LoopServerTest, BadAddressAndNoLoopsAreErrors) {
  auto serve = [](tcp::socket) -> net::awaitable<void> { co_return; };
  EXPECT_EQ(LoopServer::Start("127.0.0.1", 0, 0, serve).status().message(),
            "threads: must be at least 1");
  auto bad = LoopServer::Start("no-such-host", 0, 1, serve);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no-such-host"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace gpuha::common
