// Logging: spdlog, one line per event, with absl::string_view (which Debian's
// abseil keeps distinct from std::string_view) made printable.
#pragma once

#include <spdlog/spdlog.h>

#include "absl/strings/string_view.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
