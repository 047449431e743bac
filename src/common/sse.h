// Server-sent events (the WHATWG event-stream format), as LLM servers send
// token streams: lines of "field: value", an empty line ending each event.
//
//   SseSplitter s;
//   s.Feed(bytes, [](std::string_view raw) { SseEvent e = ParseSseEvent(raw); ... });
//
// The splitter hands over whole events only, each with its terminating
// empty line, and keeps a partial one until the rest arrives: a relay that
// forwards only what it was handed never leaves a client half an event.
// Lines end in "\n" or "\r\n" (a lone "\r", which the format also allows,
// is not taken as a line end; no LLM server sends it). Pure; no locks.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gpuha::common {

struct SseEvent {
  std::string event;          // the "event:" field; empty means "message"
  std::string data;           // the "data:" lines, joined with "\n"
  bool comment_only = false;  // only ":" lines (a keep-alive)
};
SseEvent ParseSseEvent(std::string_view raw);

class SseSplitter {
 public:
  // At most `max_event` bytes of one event are held; a longer event is an
  // error (Feed returns false, and nothing more is handed over).
  explicit SseSplitter(size_t max_event = 1 << 20) : max_event_(max_event) {}

  template <class F>
  bool Feed(std::string_view bytes, F&& on_event) {
    if (broken_) return false;
    buf_.append(bytes);
    size_t start = 0;
    for (;;) {
      size_t nl = buf_.find('\n', scan_);
      if (nl == std::string::npos) break;
      // The line before this '\n' (without its '\r') is empty: the event ends.
      size_t line_start = scan_line_;
      bool empty = nl == line_start || (nl == line_start + 1 && buf_[line_start] == '\r');
      scan_ = nl + 1;
      scan_line_ = nl + 1;
      if (empty) {
        if (nl + 1 - start > (nl == line_start ? 1u : 2u)) {  // not a stray blank line
          on_event(std::string_view(buf_).substr(start, nl + 1 - start));
        }
        start = nl + 1;
      }
    }
    buf_.erase(0, start);
    scan_ -= start;
    scan_line_ -= start;
    if (buf_.size() > max_event_) {
      broken_ = true;
      return false;
    }
    return true;
  }
  // Bytes of an event not yet complete.
  size_t pending() const { return buf_.size(); }
  // Hands them over and starts afresh (after an event over the limit, say).
  std::string TakePending() {
    std::string out = std::move(buf_);
    *this = SseSplitter(max_event_);
    return out;
  }

 private:
  size_t max_event_;
  std::string buf_;
  size_t scan_ = 0;       // where the search for the next '\n' resumes
  size_t scan_line_ = 0;  // where the current line starts
  bool broken_ = false;
};

}  // namespace gpuha::common
