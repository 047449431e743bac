#include "common/heartbeat_datagram.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
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

uint64_t ReadBigEndian(absl::string_view eight) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(eight[i]);
  return v;
}

}  // namespace

struct DatagramKey::Impl {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
};

absl::StatusOr<std::unique_ptr<DatagramKey>> DatagramKey::Create(absl::string_view key) {
  auto impl = std::make_unique<Impl>();
  impl->mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (impl->mac != nullptr) impl->ctx = EVP_MAC_CTX_new(impl->mac);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  const bool ok = impl->ctx != nullptr &&
                  EVP_MAC_init(impl->ctx, reinterpret_cast<const unsigned char*>(key.data()),
                               key.size(), params) == 1;
  std::unique_ptr<DatagramKey> k(new DatagramKey(impl.release()));  // frees what was made
  if (!ok) {
    return absl::UnavailableError(
        "heartbeat datagrams: this OpenSSL has no HMAC-SHA256 (EVP_MAC_fetch/EVP_MAC_init)");
  }
  return k;
}

DatagramKey::~DatagramKey() {
  EVP_MAC_CTX_free(impl_->ctx);
  EVP_MAC_free(impl_->mac);
  delete impl_;
}

std::string DatagramKey::Mac(absl::string_view head, absl::string_view payload) {
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  // A NULL key starts a new MAC with the key already set.
  if (EVP_MAC_init(impl_->ctx, nullptr, 0, nullptr) != 1 ||
      EVP_MAC_update(impl_->ctx, reinterpret_cast<const unsigned char*>(head.data()),
                     head.size()) != 1 ||
      EVP_MAC_update(impl_->ctx, reinterpret_cast<const unsigned char*>(payload.data()),
                     payload.size()) != 1 ||
      EVP_MAC_final(impl_->ctx, out, &len, sizeof(out)) != 1) {
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string SealDatagram(uint64_t session, DatagramKey& key, absl::string_view payload) {
  std::string d(kDatagramHeaderBytes, '\0');
  d.replace(0, kDatagramMagic.size(), kDatagramMagic.data(), kDatagramMagic.size());
  PutBigEndian(session, d.data() + kSessionAt);
  d.replace(kMacAt, kMacBytes, key.Mac(absl::string_view(d).substr(0, kMacAt), payload));
  d.append(payload.data(), payload.size());
  return d;
}

absl::StatusOr<uint64_t> DatagramSession(absl::string_view datagram) {
  if (datagram.size() < kDatagramHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("datagram of ", datagram.size(),
                                                   " bytes: shorter than its ",
                                                   kDatagramHeaderBytes, "-byte header"));
  }
  // Checked before anything is MAC'd: a flood of 64 KiB datagrams costs
  // the receiver a length compare each, not a hash of each.
  if (datagram.size() > kMaxDatagramBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datagram of ", datagram.size(), " bytes: longer than a heartbeat's ", kMaxDatagramBytes));
  }
  if (datagram.substr(0, kDatagramMagic.size()) != kDatagramMagic) {
    return absl::InvalidArgumentError(absl::StrCat("bytes 0-3 are \"",
                                                   absl::CHexEscape(datagram.substr(0, 4)),
                                                   "\", not \"", kDatagramMagic, "\""));
  }
  return ReadBigEndian(datagram.substr(kSessionAt, 8));
}

absl::StatusOr<absl::string_view> OpenDatagram(absl::string_view datagram, DatagramKey& key) {
  absl::StatusOr<uint64_t> session = DatagramSession(datagram);
  if (!session.ok()) return session.status();
  absl::string_view payload = datagram.substr(kDatagramHeaderBytes);
  const std::string want = key.Mac(datagram.substr(0, kMacAt), payload);
  if (CRYPTO_memcmp(want.data(), datagram.data() + kMacAt, kMacBytes) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("bytes 12-43: the HMAC-SHA256 is not session ", *session, "'s key's"));
  }
  return payload;
}

uint64_t RandomSession() {
  for (;;) {
    if (const uint64_t s = ReadBigEndian(RandomBytes(8)); s != 0) return s;
  }
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::abort();  // no entropy: nothing secret can be made
  }
  return out;
}

}  // namespace gpuha::common
