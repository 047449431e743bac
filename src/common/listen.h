// ListenReusePort: one listening socket per event loop on the same address and
// port (SO_REUSEPORT), so the kernel spreads new connections across loops and
// no loop hands sockets to another. Used by the router, the worker and the
// test backend.
//
// LoopServer: the whole multi-loop server around it, for servers whose
// connections need nothing from the loop but the socket (the worker, the
// test backend): N loops, one thread each, every accepted connection handed
// to `serve` as a coroutine on the loop that accepted it.
//
//   auto server = LoopServer::Start("127.0.0.1", 0, 4,
//       [this](tcp::socket s) { return Serve(std::move(s)); });
//   server->port(); ... server->Stop();   // joins the loops
//
// Thread-safety: `serve` runs on many loops at once. Stop (or the destructor)
// must run before whatever `serve` touches is destroyed.
#pragma once

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::common {

// Out of file descriptors, accept fails again at once while the connection
// waits in the backlog, so an accept loop that retries at once spins (the
// router once used 96% CPU and logged 680,000 lines in 4 s). Every accept
// loop pauses this long on EMFILE or ENFILE, as nginx does, and keeps
// serving the connections it has.
inline constexpr std::chrono::milliseconds kAcceptPause{500};
inline bool OutOfDescriptors(const boost::system::error_code& ec) {
  return ec == boost::asio::error::no_descriptors || ec.value() == ENFILE;
}

// `port` 0 picks a free port for the first loop; the rest share it. Errors
// name the address and the reason.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>>>
ListenReusePort(const std::vector<boost::asio::io_context*>& loops, const std::string& host,
                uint16_t port);

class LoopServer {
 public:
  using Serve = std::function<boost::asio::awaitable<void>(boost::asio::ip::tcp::socket)>;
  // Errors: no loops, or the address could not be bound (named).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LoopServer>> Start(const std::string& host,
                                                                         uint16_t port, int loops,
                                                                         Serve serve);
  ~LoopServer();
  LoopServer(const LoopServer&) = delete;
  LoopServer& operator=(const LoopServer&) = delete;

  uint16_t port() const { return port_; }
  // Stops every loop and joins its thread; connections in flight are dropped.
  void Stop();

 private:
  LoopServer() = default;
  boost::asio::awaitable<void> Accept(boost::asio::ip::tcp::acceptor& a);

  Serve serve_;
  std::vector<std::unique_ptr<boost::asio::io_context>> loops_;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> acceptors_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
};

}  // namespace gpuha::common
