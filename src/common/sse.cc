#include "common/sse.h"

namespace gpuha::common {

SseEvent ParseSseEvent(std::string_view raw) {
  SseEvent e;
  bool any_field = false;
  bool any_data = false;
  while (!raw.empty()) {
    size_t nl = raw.find('\n');
    std::string_view line = raw.substr(0, nl);
    raw = nl == std::string_view::npos ? std::string_view() : raw.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line[0] == ':') continue;  // a comment
    any_field = true;
    size_t colon = line.find(':');
    std::string_view name = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (name == "data") {
      if (any_data) e.data.push_back('\n');
      e.data.append(value);
      any_data = true;
    } else if (name == "event") {
      e.event.assign(value);
    }
    // id and retry mean nothing to an LLM relay; unknown fields are ignored,
    // as the format says.
  }
  e.comment_only = !any_field;
  return e;
}

}  // namespace gpuha::common
