// JsonDepthWithin: whether JSON text nests arrays and objects no deeper
// than `max`. nlohmann's parser is iterative, but copying and dumping a
// value recurse: a value nested tens of thousands deep, well inside any body
// limit, would overflow a thread's stack. Text from a peer is checked before
// it is parsed. Strings are skipped (with their escapes); the text need not
// be valid JSON (the parser judges that).
#pragma once

#include <string_view>

namespace gpuha::common {

inline bool JsonDepthWithin(std::string_view text, int max) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// Deep enough for any LLM request or chunk (messages of content parts, tool
// schemas), far from any stack's limit.
inline constexpr int kMaxJsonDepth = 64;

}  // namespace gpuha::common
