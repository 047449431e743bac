// ListenReusePort: one listening socket per event loop on the same address and
// port (SO_REUSEPORT), so the kernel spreads new connections across loops and
// no loop hands sockets to another. Used by the router, the worker and the
// test backend.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::common {

// `port` 0 picks a free port for the first loop; the rest share it. Errors
// name the address and the reason.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>>>
ListenReusePort(const std::vector<boost::asio::io_context*>& loops, const std::string& host,
                uint16_t port);

}  // namespace gpuha::common
