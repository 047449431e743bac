// ClientConn: the client side of the router's request path. Accept takes
// connections on a loop's acceptor (TLS when configured); each connection is
// one coroutine that reads requests with keep-alive and, for each, runs
// admission (tenant, route, limits), buffers the body up to the retry buffer
// and tries the chosen upstreams in order through Exchange, within the retry
// budget. Every early answer is a clear error with a reason.
//
// Internal to the router. Thread-safety: a connection lives on one loop.
#pragma once

#include <array>
#include <cstddef>
#include <memory_resource>
#include <optional>
#include <string>

#include "router/admission.h"
#include "router/loop.h"

namespace gpuha::router {

// What one client connection keeps from one request to the next.
struct ClientConn {
  beast::flat_buffer buf;  // bytes read from the client, not yet parsed
  std::string peer_ip;
  KeyCache key_cache;  // the last API key's tenant
  // Keep their capacity: no allocation per request.
  std::string head;     // the head sent upstream
  std::string pending;  // the answer for the client, before it is written
  // The request's and the response's header fields are allocated from here
  // (an arena per request over this storage, spilling to the heap).
  alignas(std::max_align_t) std::array<char, 2048> field_storage;
  std::pmr::memory_resource* fields = nullptr;  // the current request's arena
};

// Accepts connections on L.acceptor until it is closed; serves each on L.
awaitable<void> Accept(Loop& L);

// One request, its head parsed from cc.buf (reading `client` for more),
// admitted and answered through the upstreams; its latency observed. False
// when the connection must not take another request (closed, an error
// answered, Connection: close). HTTP/1.1 connections run it for each
// request; an HTTP/2 REST stream runs it once (router/h2_rest.h).
template <class Stream>
awaitable<bool> ServeRequest(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc);

// An HTTP/2 client connection (h2c prior knowledge, or ALPN h2 over TLS),
// after its first bytes were read into `buf` (router/grpc_conn.cc): gRPC
// calls, each routed and failed over as an HTTP/1.1 request is.
template <class Stream>
awaitable<void> ServeH2(Loop& L, Stream& client, Deadline& lowest, const std::string& peer_ip,
                        beast::flat_buffer& buf);

}  // namespace gpuha::router
