#include "gpu/kernel_log.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace gpuha::gpu {
namespace {

bool ParseHex(absl::string_view s, size_t max_digits, uint32_t* out) {
  if (s.empty() || s.size() > max_digits) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
    v = v * 16 +
        static_cast<uint32_t>(absl::ascii_isdigit(static_cast<unsigned char>(c))
                                  ? c - '0'
                                  : absl::ascii_tolower(static_cast<unsigned char>(c)) - 'a' + 10);
  }
  *out = v;
  return true;
}

constexpr size_t kMaxLinesPerRead = 4096;

}  // namespace

std::string PciSlot(absl::string_view address) {
  absl::ConsumePrefix(&address, "PCI:");
  std::vector<absl::string_view> parts = absl::StrSplit(address, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0");  // no domain
  if (parts.size() != 3) return "";
  absl::string_view device = parts[2];
  if (size_t dot = device.find('.'); dot != absl::string_view::npos) {
    uint32_t function = 0;
    if (!ParseHex(device.substr(dot + 1), 1, &function)) return "";
    device = device.substr(0, dot);
  }
  uint32_t domain = 0, bus = 0, dev = 0;
  if (!ParseHex(parts[0], 8, &domain) || !ParseHex(parts[1], 2, &bus) ||
      !ParseHex(device, 2, &dev) || domain > 0xffff || dev > 0x1f) {
    return "";
  }
  return absl::StrFormat("%04x:%02x:%02x", domain, bus, dev);
}

std::optional<KernelXid> ParseKernelXid(absl::string_view line) {
  size_t nvrm = line.find("NVRM: ");
  if (nvrm == absl::string_view::npos) return std::nullopt;
  absl::string_view msg = line.substr(nvrm + 6);
  if (absl::ConsumePrefix(&msg, "Xid (")) {
    // "Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    size_t close = msg.find("): ");
    if (close == absl::string_view::npos) return std::nullopt;
    // A MIG instance's XID names it after the slot: "PCI:0000:01:00 GPU-I:05".
    absl::string_view address = msg.substr(0, close);
    std::string slot = PciSlot(address.substr(0, address.find(' ')));
    absl::string_view rest = msg.substr(close + 3);
    absl::string_view number = rest.substr(0, rest.find_first_not_of("0123456789"));
    uint32_t xid = 0;
    if (slot.empty() || !absl::SimpleAtoi(number, &xid)) return std::nullopt;
    KernelXid k;
    k.pci_slot = std::move(slot);
    XidEvent& e = k.event;
    e.xid = xid;
    // "pid=702, name=python3, ...": the process whose work faulted.
    if (size_t at = rest.find("pid="); at != absl::string_view::npos) {
      absl::string_view pid = rest.substr(at + 4);
      pid = pid.substr(0, pid.find_first_of(", "));
      int64_t n = 0;
      if (absl::SimpleAtoi(pid, &n) && n > 0) e.pid = n;
    }
    if (size_t at = rest.find("name="); at != absl::string_view::npos) {
      absl::string_view name = rest.substr(at + 5);
      name = name.substr(0, name.find(','));
      if (name != "<unknown>") e.process = std::string(name);
    }
    // "154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot
    // Required)": the value and the words after " to " name the action now
    // required.
    if (xid == 154) {
      if (size_t to = rest.rfind(" to 0x"); to != absl::string_view::npos) {
        absl::string_view after = rest.substr(to + 6);
        uint32_t value = 0;
        if (absl::SimpleHexAtoi(after.substr(0, after.find_first_of(" (")), &value)) {
          e.recovery_value = static_cast<int>(value);
        }
        size_t open = after.find('(');
        size_t close = open == absl::string_view::npos ? open : after.find(')', open);
        if (close != absl::string_view::npos) {
          e.recovery_action = std::string(after.substr(open + 1, close - open - 1));
        }
      }
    }
    // "13, pid=..., Graphics SM Warp Exception on (GPC 3, TPC 1, SM 0): ..."
    if (xid == 13) {
      auto number_after = [&](absl::string_view label) -> std::optional<uint32_t> {
        size_t at = rest.find(label);
        if (at == absl::string_view::npos) return std::nullopt;
        absl::string_view n = rest.substr(at + label.size());
        n = n.substr(0, n.find_first_not_of("0123456789"));
        uint32_t v = 0;
        return absl::SimpleAtoi(n, &v) ? std::optional<uint32_t>(v) : std::nullopt;
      };
      e.gpc = number_after("(GPC ");
      e.tpc = e.gpc ? number_after(", TPC ") : std::nullopt;
      if (!e.tpc) e.gpc.reset();
    }
    // "74, pid=..., NVLink: fatal error detected on link 6(0x10000, 0x0,
    // 0x0, 0x0, 0x0, 0x0, 0x0)": the link and REG0-REG6.
    if (xid == 74) {
      if (size_t at = rest.rfind(" link "); at != absl::string_view::npos) {
        absl::string_view after = rest.substr(at + 6);
        const size_t open = after.find('(');
        const size_t close = after.find(')');
        uint32_t link = 0;
        if (open != absl::string_view::npos && close != absl::string_view::npos && open < close &&
            absl::SimpleAtoi(absl::StripAsciiWhitespace(after.substr(0, open)), &link)) {
          std::vector<uint32_t> regs;
          for (absl::string_view r :
               absl::StrSplit(after.substr(open + 1, close - open - 1), ',')) {
            r = absl::StripAsciiWhitespace(r);
            uint32_t v = 0;
            if (!absl::ConsumePrefix(&r, "0x") || !absl::SimpleHexAtoi(r, &v)) {
              regs.clear();
              break;
            }
            regs.push_back(v);
          }
          if (!regs.empty()) {
            e.link = link;
            e.nvlink_regs = std::move(regs);
          }
        }
      }
    }
    // "45, pid=..., Ch 00000010 ... caused by previous Xid 31"
    if (xid == 45) {
      if (size_t at = rest.rfind("caused by previous Xid "); at != absl::string_view::npos) {
        absl::string_view n = rest.substr(at + 23);
        n = n.substr(0, n.find_first_not_of("0123456789"));
        uint32_t cause = 0;
        if (absl::SimpleAtoi(n, &cause)) e.caused_by = cause;
      }
    }
    // "145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 10 (0x04082907 0x00000008 ...)"
    if (xid >= 144 && xid <= 150) {
      if (size_t open = rest.rfind('('); open != absl::string_view::npos) {
        std::vector<absl::string_view> regs =
            absl::StrSplit(rest.substr(open + 1), absl::ByAnyChar(" )"), absl::SkipEmpty());
        uint32_t intr = 0, status = 0;
        if (regs.size() >= 2 && absl::ConsumePrefix(&regs[0], "0x") &&
            absl::ConsumePrefix(&regs[1], "0x") && absl::SimpleHexAtoi(regs[0], &intr) &&
            absl::SimpleHexAtoi(regs[1], &status)) {
          e.intr_info = intr;
          e.error_status = status;
        }
      }
    }
    return k;
  }
  if (msg.find("fallen off the bus") == absl::string_view::npos) return std::nullopt;
  // "GPU 0000:3b:00.0: GPU has fallen off the bus." and "The NVIDIA GPU
  // 0000:3b:00.0 (PCI ID: 10de:20b5) ... has fallen off the bus": the first
  // word that is a PCI address names the GPU.
  for (absl::string_view word : absl::StrSplit(msg, ' ', absl::SkipEmpty())) {
    absl::ConsumeSuffix(&word, ":");
    if (word.find(':') == absl::string_view::npos) continue;
    std::string slot = PciSlot(word);
    if (slot.empty()) continue;
    KernelXid k;
    k.pci_slot = std::move(slot);
    k.event.xid = 79;
    return k;
  }
  return std::nullopt;
}

std::optional<absl::string_view> KmsgKernelMessage(absl::string_view record) {
  size_t semi = record.find(';');
  if (semi == absl::string_view::npos) return std::nullopt;
  uint32_t prio = 0;
  if (!absl::SimpleAtoi(record.substr(0, std::min(record.find(','), semi)), &prio) ||
      (prio >> 3) != 0) {
    return std::nullopt;  // not the kernel's (a process wrote it), or damaged
  }
  absl::string_view msg = record.substr(semi + 1);
  return msg.substr(0, msg.find('\n'));
}

absl::StatusOr<std::unique_ptr<KernelLog>> KernelLog::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel log '", path, "': ", std::strerror(errno),
                     errno == EACCES || errno == EPERM
                         ? " (reading /dev/kmsg needs root or CAP_SYSLOG; or set gpu.kernel_log)"
                         : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISREG(st.st_mode))) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("kernel log '", path, "': not a character device or a file"));
  }
  const bool kmsg = S_ISCHR(st.st_mode);
  // /dev/kmsg: skip to after the last record (else the whole ring is replayed).
  if (kmsg && ::lseek(fd, 0, SEEK_END) < 0) {
    int err = errno;
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("kernel log '", path, "': cannot seek to its end: ", std::strerror(err)));
  }
  return std::unique_ptr<KernelLog>(new KernelLog(path, fd, kmsg, kmsg ? 0 : st.st_size));
}

KernelLog::~KernelLog() { ::close(fd_); }

bool KernelLog::Wait(std::chrono::milliseconds timeout) {
  if (!kmsg_) return false;
  struct pollfd p {};
  p.fd = fd_;
  p.events = POLLIN;
  ::poll(&p, 1, static_cast<int>(timeout.count()));  // EINTR: the caller reads, then waits again
  return true;
}

absl::StatusOr<std::vector<std::string>> KernelLog::ReadNew() {
  std::vector<std::string> lines;
  if (!kmsg_) {
    if (absl::Status s = ReadFileLines(&lines); !s.ok()) return s;
    // Renamed away (logrotate): the old file was read to its end above; the
    // new one at the path is read from its start.
    struct stat now {
    }, mine{};
    if (::stat(path_.c_str(), &now) == 0 && ::fstat(fd_, &mine) == 0 &&
        (now.st_ino != mine.st_ino || now.st_dev != mine.st_dev)) {
      int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) {
        ::close(fd_);
        fd_ = fd;
        offset_ = 0;
        partial_.clear();
        if (absl::Status s = ReadFileLines(&lines); !s.ok()) return s;
      }
    }
    return lines;
  }
  char buf[8192];
  while (lines.size() < kMaxLinesPerRead) {
    ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n > 0) {
      if (auto msg = KmsgKernelMessage(absl::string_view(buf, static_cast<size_t>(n)))) {
        lines.emplace_back(*msg);
      }
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EPIPE)) continue;  // EPIPE: records overwritten
    if (n < 0 && errno != EAGAIN) {
      return absl::UnavailableError(
          absl::StrCat("kernel log '", path_, "': ", std::strerror(errno)));
    }
    break;  // EAGAIN: nothing more
  }
  return lines;
}

absl::Status KernelLog::ReadFileLines(std::vector<std::string>* lines) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    return absl::UnavailableError(absl::StrCat("kernel log '", path_, "': ", std::strerror(errno)));
  }
  if (st.st_size < offset_) {  // truncated in place (copytruncate): start over
    offset_ = 0;
    partial_.clear();
  }
  char buf[8192];
  while (offset_ < st.st_size && lines->size() < kMaxLinesPerRead) {
    ssize_t n = ::pread(fd_, buf, sizeof(buf), offset_);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(
          absl::StrCat("kernel log '", path_, "': ", std::strerror(errno)));
    }
    if (n == 0) break;
    offset_ += n;
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines->push_back(partial_.substr(start, nl - start));
    }
    partial_.erase(0, start);
    if (partial_.size() > 65536) partial_.clear();  // no line is that long; drop garbage
  }
  return absl::OkStatus();
}

bool XidDeduper::Fresh(XidSource source, uint32_t gpu, uint32_t xid, common::TimePoint now) {
  for (auto it = unpaired_.begin(); it != unpaired_.end();) {
    std::deque<Copy>& q = it->second;
    while (!q.empty() && now - q.front().at >= window_) q.pop_front();
    it = q.empty() ? unpaired_.erase(it) : std::next(it);
  }
  std::deque<Copy>& q = unpaired_[{gpu, xid}];
  auto other = std::find_if(q.begin(), q.end(), [&](const Copy& c) { return c.source != source; });
  if (other != q.end()) {
    q.erase(other);  // the other source's copy of this occurrence, reported already
    return false;
  }
  q.push_back({source, now});
  return true;
}

}  // namespace gpuha::gpu
