// JoinTokens: the registration's join token (registration.join_token_sha256)
// and the guard against guessing it. A source IP that sent
// kMaxWrongPerSecond wrong tokens within a second is refused unchecked for
// the rest of that second: a guesser gets no more tries than that, and no
// log line for each.
//
//   JoinTokens tokens(config.registration.join_token_sha256);
//   absl::Status s = tokens.Check(hello.node(), token, peer_ip, clock.Now());
//
// Thread-safety: none; the controller holds its lock around it.
#pragma once

#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "common/clock.h"

namespace gpuha::controller {

class JoinTokens {
 public:
  static constexpr int kMaxWrongPerSecond = 10;
  // Sources remembered at most (all forgotten when full).
  static constexpr size_t kSourcesKept = 4096;

  // `want_sha256`: the token's SHA-256 in lower-case hex; empty: none asked.
  explicit JoinTokens(std::string want_sha256) : want_(std::move(want_sha256)) {}

  // OK when no token is asked or `token` is the one. PermissionDenied
  // naming `node` when it is missing or wrong; ResourceExhausted, unchecked,
  // for a `peer_ip` (empty: unknown, never throttled) past its wrong ones.
  [[nodiscard]] absl::Status Check(const std::string& node, const std::string& token,
                                   const std::string& peer_ip, common::TimePoint now);

 private:
  struct Wrong {
    common::TimePoint since;  // the second they are counted in began then
    int count = 0;
  };
  const std::string want_;
  std::unordered_map<std::string, Wrong> wrong_;  // by source IP
};

}  // namespace gpuha::controller
