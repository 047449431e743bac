// Hand-made HTTP/2 bytes for tests that speak to the router as a client
// nghttp2 would not be: frames of any type and flags, and an HPACK header
// block of literals.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpuha::router::testing {

// One frame (RFC 9113 4.1): a 24-bit length, type, flags, a 31-bit stream.
inline std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  f.push_back(static_cast<char>(payload.size() >> 16));
  f.push_back(static_cast<char>(payload.size() >> 8));
  f.push_back(static_cast<char>(payload.size()));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) f.push_back(static_cast<char>(stream >> shift));
  return f + payload;
}

// A header block of literal fields without indexing, new names (RFC 7541
// 6.2.2), each name and value under 127 bytes.
inline std::string LiteralBlock(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string b;
  for (const auto& [n, v] : fields) {
    b.push_back('\0');
    b.push_back(static_cast<char>(n.size()));
    b += n;
    b.push_back(static_cast<char>(v.size()));
    b += v;
  }
  return b;
}

}  // namespace gpuha::router::testing
