// RawHttp: blocking HTTP/1.1 exchanges with exact bytes on the wire, for tests
// of the router and the worker (malformed input, keep-alive, TLS).
#pragma once

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <string>

namespace gpuha::testing {

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  std::string error;  // transport error, if any
};

// Writes `raw` on `s` and reads one response.
template <class Stream>
Reply Exchange(Stream& s, const std::string& raw) {
  namespace http = boost::beast::http;
  Reply r;
  boost::system::error_code ec;
  boost::asio::write(s, boost::asio::buffer(raw), ec);
  if (ec) {
    r.error = ec.message();
    return r;
  }
  boost::beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(64 << 20);
  http::read(s, buf, p, ec);
  if (ec) {
    r.error = ec.message();
    return r;
  }
  r.status = p.get().result_int();
  for (const auto& f : p.get()) r.headers[std::string(f.name_string())] = std::string(f.value());
  r.body = p.get().body();
  return r;
}

// One request on a fresh loopback connection; 10 s receive timeout.
inline Reply Send(uint16_t port, const std::string& raw) {
  using tcp = boost::asio::ip::tcp;
  boost::asio::io_context ioc;
  tcp::socket s(ioc);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return Reply{0, {}, "", ec.message()};
  struct timeval tv = {10, 0};
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return Exchange(s, raw);
}

// "GET target" with an X-Api-Key (none if empty) and extra header lines.
inline std::string Get(const std::string& target, const std::string& key,
                       const std::string& extra = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: r\r\n" +
         (key.empty() ? "" : "X-Api-Key: " + key + "\r\n") + extra + "\r\n";
}

}  // namespace gpuha::testing
