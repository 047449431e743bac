#include "controller/join_tokens.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/net_util.h"

namespace gpuha::controller {

absl::Status JoinTokens::Check(const std::string& node, const std::string& token,
                               const std::string& peer_ip, common::TimePoint now) {
  if (want_.empty()) return absl::OkStatus();
  Wrong* wrong = nullptr;
  if (!peer_ip.empty()) {
    auto it = wrong_.find(peer_ip);
    if (it != wrong_.end() && now - it->second.since < std::chrono::seconds(1)) {
      wrong = &it->second;
    }
    if (wrong != nullptr && wrong->count >= kMaxWrongPerSecond) {
      return absl::ResourceExhaustedError(
          absl::StrCat("too many wrong join tokens from ", peer_ip, " (", kMaxWrongPerSecond,
                       " a second): refused unchecked for the rest of the second"));
    }
  }
  if (common::Sha256Hex(token) == want_) return absl::OkStatus();
  if (!peer_ip.empty()) {
    if (wrong == nullptr) {
      if (wrong_.size() >= kSourcesKept) wrong_.clear();
      wrong = &wrong_[peer_ip];
      *wrong = {now, 0};
    }
    wrong->count++;
  }
  return absl::PermissionDeniedError(
      absl::StrCat("node '", absl::CHexEscape(node), "': the join token is ",
                   token.empty() ? "missing" : "wrong", " (--join-token-file)"));
}

}  // namespace gpuha::controller
