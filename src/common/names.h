// Names that travel between components: stream IDs, node names, tenant
// names. Each is checked where it enters (config, API, agent hello, store
// rows read back) by the one rule here, so a name one component accepts is
// one every other can route, store and show: no NUL (SQLite once cut a key
// there and moved a stream to another tenant), no '/', no spaces, bounded.
// Header-only: the router's fuzz target compiles request.cc alone.
#pragma once

#include <string_view>

namespace gpuha::common {

// 1-128 of [A-Za-z0-9._:-]: a stream ID, which the router reads from a path
// segment or a header.
inline bool ValidStreamId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}
inline constexpr const char* kStreamIdRule = "1-128 of [A-Za-z0-9._:-]";

// 1-63 of [A-Za-z0-9._-], not starting with '.' or '-': a node or tenant
// name (a host name label, give or take '_' and '.').
inline bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > 63 || n[0] == '.' || n[0] == '-') return false;
  for (char c : n) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}
inline constexpr const char* kNameRule = "1-63 of [A-Za-z0-9._-], not starting with '.' or '-'";

}  // namespace gpuha::common
