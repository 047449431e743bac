// A heartbeat as one authenticated UDP datagram (BFD's and keepalived's way
// of beating): the agent sends it with one system call and nothing answers.
//
//   bytes 0-3    "GHB1"
//   bytes 4-11   the session, big-endian: which stream's key signs it
//   bytes 12-43  HMAC-SHA256 over bytes 0-11 and the payload, with that key
//   bytes 44-    the payload (a serialized v1::Heartbeat)
//
//   auto key = DatagramKey::Create(bytes);             // 32 bytes
//   std::string d = SealDatagram(session, **key, payload);
//   absl::StatusOr<uint64_t> s = DatagramSession(d);   // whose key to look up
//   absl::StatusOr<absl::string_view> p = OpenDatagram(d, **key);
//
// The key comes over the agent's gRPC stream (TLS when configured), so a
// datagram proves what the stream proved; its sequence number, checked by
// the receiver, makes a replay stale. Errors name the bytes at fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::common {

inline constexpr absl::string_view kDatagramMagic = "GHB1";
inline constexpr size_t kDatagramKeyBytes = 32;
inline constexpr size_t kDatagramHeaderBytes = 4 + 8 + 32;
// Larger heartbeats go on the stream: one Ethernet frame, with room for
// IPv6 and UDP headers, never fragmented.
inline constexpr size_t kMaxDatagramBytes = 1400;

// A session's HMAC-SHA256 key, its OpenSSL context made once: a one-shot
// HMAC() looks the digest and the MAC up by name on every call, which cost
// the agent a tenth of its heartbeat thread. Not thread-safe.
class DatagramKey {
 public:
  // Unavailable when this OpenSSL has no HMAC-SHA256 (a FIPS provider
  // without it): the caller beats on its stream instead.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DatagramKey>> Create(absl::string_view key);
  ~DatagramKey();
  DatagramKey(const DatagramKey&) = delete;
  DatagramKey& operator=(const DatagramKey&) = delete;
  // The 32-byte MAC of `head` then `payload`.
  std::string Mac(absl::string_view head, absl::string_view payload);

 private:
  struct Impl;
  explicit DatagramKey(Impl* impl) : impl_(impl) {}
  Impl* impl_;
};

std::string SealDatagram(uint64_t session, DatagramKey& key, absl::string_view payload);
// The session named in bytes 4-11, once the size and magic are right.
absl::StatusOr<uint64_t> DatagramSession(absl::string_view datagram);
// The payload, if the MAC is `key`'s (compared in constant time).
absl::StatusOr<absl::string_view> OpenDatagram(absl::string_view datagram, DatagramKey& key);

// `n` bytes from OpenSSL's CSPRNG (keys).
std::string RandomBytes(size_t n);
// A random session number, never 0.
uint64_t RandomSession();

}  // namespace gpuha::common
