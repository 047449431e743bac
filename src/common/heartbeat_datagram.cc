#include "common/heartbeat_datagram.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpuha::common {
namespace {

constexpr size_t kSessionAt = 4;
constexpr size_t kMacAt = 12;
constexpr size_t kMacBytes = 32;

void PutBigEndian(uint64_t v, char* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

// HMAC-SHA256 over the first 12 bytes of `head` and `payload`.
std::string Mac(absl::string_view key, absl::string_view head, absl::string_view payload) {
  std::string signed_bytes;
  signed_bytes.reserve(kMacAt + payload.size());
  signed_bytes.append(head.data(), kMacAt);
  signed_bytes.append(payload.data(), payload.size());
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(signed_bytes.data()), signed_bytes.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

}  // namespace

std::string SealDatagram(uint64_t session, absl::string_view key, absl::string_view payload) {
  std::string d(kDatagramHeaderBytes, '\0');
  d.replace(0, kDatagramMagic.size(), kDatagramMagic.data(), kDatagramMagic.size());
  PutBigEndian(session, d.data() + kSessionAt);
  d.replace(kMacAt, kMacBytes, Mac(key, d, payload));
  d.append(payload.data(), payload.size());
  return d;
}

absl::StatusOr<uint64_t> DatagramSession(absl::string_view datagram) {
  if (datagram.size() < kDatagramHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("datagram of ", datagram.size(),
                                                   " bytes: shorter than its ",
                                                   kDatagramHeaderBytes, "-byte header"));
  }
  if (datagram.substr(0, kDatagramMagic.size()) != kDatagramMagic) {
    return absl::InvalidArgumentError(absl::StrCat("bytes 0-3 are \"",
                                                   absl::CHexEscape(datagram.substr(0, 4)),
                                                   "\", not \"", kDatagramMagic, "\""));
  }
  uint64_t session = 0;
  for (size_t i = 0; i < 8; ++i) {
    session = (session << 8) | static_cast<unsigned char>(datagram[kSessionAt + i]);
  }
  return session;
}

absl::StatusOr<absl::string_view> OpenDatagram(absl::string_view datagram, absl::string_view key) {
  absl::StatusOr<uint64_t> session = DatagramSession(datagram);
  if (!session.ok()) return session.status();
  absl::string_view payload = datagram.substr(kDatagramHeaderBytes);
  const std::string want = Mac(key, datagram, payload);
  if (CRYPTO_memcmp(want.data(), datagram.data() + kMacAt, kMacBytes) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("bytes 12-43: the HMAC-SHA256 is not session ", *session, "'s key's"));
  }
  return payload;
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::abort();  // no entropy: nothing secret can be made
  }
  return out;
}

}  // namespace gpuha::common
