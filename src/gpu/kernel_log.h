// The kernel log as a second XID source. The NVIDIA driver writes every XID
// to the kernel log ("NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen
// off the bus."), also when NVML's event set is not delivering: the library
// hung, or the GPU fell off the bus before it could raise the event.
//
//   auto log = KernelLog::Open("/dev/kmsg");   // or a file that grows
//   for (const std::string& line : *log->ReadNew()) {
//     if (auto x = ParseKernelXid(line)) ... // {pci "0000:3b:00", xid 79}
//   }
//   XidDeduper dedup;  // NVML's event and the log line are one XID
//   if (dedup.Fresh(XidSource::kKernelLog, gpu, xid, now)) report it;
//
// /dev/kmsg is read from its end at Open(): an XID logged before the agent
// started (and perhaps cleared by a reset since) is not replayed. Only the
// kernel's own records count (facility 0): a line a process wrote to
// /dev/kmsg cannot fake an XID. A regular file is also read from its end,
// and followed as it grows; a file that shrank (copytruncate) is read again
// from its start, and one renamed away (logrotate's default) is read to its
// end and the new file at the path from its start. A file's lines are taken
// as kernel lines: point gpu.kernel_log only at a file the kernel's log
// alone is written to.
//
// Thread-safety: KernelLog and XidDeduper belong to one thread (the agent's
// event loop); ParseKernelXid and PciSlot are pure.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "gpu/gpu_probe.h"

namespace gpuha::gpu {

struct KernelXid {
  std::string pci_slot;  // "0000:3b:00" (domain:bus:device, lower case)
  // What the line says of it: the XID; the process the driver names
  // ("pid=702, name=python3"; 0 and empty for '<unknown>' or none); XID
  // 154's action ("... to 0x2 (Node Reboot Required)": 2 and its words);
  // XID 45's cause; 144-150's IntrInfo and Error Status. The GPU, the time
  // and whose the process is are the agent's to fill in.
  XidEvent event;
};

// One kernel log line (a /dev/kmsg record "6,812,9172,-;NVRM: ..." or a
// dmesg/journal line). Recognises "NVRM: Xid (PCI:<slot>): <n>, ..." (a MIG
// instance's "(PCI:<slot> GPU-I:05 GPU-CI:00)" too) and "NVRM: GPU
// <slot>...: GPU has fallen off the bus." (reported as XID 79).
std::optional<KernelXid> ParseKernelXid(absl::string_view line);

// The message of one /dev/kmsg record ("prio,seq,usec,flags;message\n" plus
// continuation lines); nullopt unless it is the kernel's (facility 0).
std::optional<absl::string_view> KmsgKernelMessage(absl::string_view record);

// A PCI address in NVML's form ("00000000:3B:00.0"), sysfs's ("0000:3b:00.0")
// or the driver log's ("0000:3b:00") as "dddd:bb:dd", lower case; empty when
// it is not one.
std::string PciSlot(absl::string_view address);

class KernelLog {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KernelLog>> Open(const std::string& path);
  ~KernelLog();
  KernelLog(const KernelLog&) = delete;
  KernelLog& operator=(const KernelLog&) = delete;

  // The lines written since the last call (never blocks). An error that is
  // not "nothing new" names the log; the next call tries again.
  absl::StatusOr<std::vector<std::string>> ReadNew();
  // /dev/kmsg: blocks until a record is there to read or `timeout` passed,
  // and returns true. A file cannot be waited on this way: false at once.
  bool Wait(std::chrono::milliseconds timeout);
  const std::string& path() const { return path_; }

 private:
  KernelLog(std::string path, int fd, bool kmsg, int64_t offset)
      : path_(std::move(path)), fd_(fd), kmsg_(kmsg), offset_(offset) {}
  absl::Status ReadFileLines(std::vector<std::string>* lines);

  const std::string path_;
  int fd_;
  const bool kmsg_;      // records, one per read(); else a file of lines
  int64_t offset_ = 0;   // a file's read position
  std::string partial_;  // a file's last line, not yet ended
};

// Where a copy of an XID came from: one occurrence is told by both.
enum class XidSource { kNvml, kKernelLog };

// Merges the two copies of one XID occurrence, NVML's event and the kernel
// log's line, which arrive a few milliseconds apart, and nothing else: each
// copy pairs with at most one unpaired copy of the other source on the same
// GPU and XID within `window`. Every occurrence counts once, however close
// the next: three real XID 31s 4.3 s apart are three (a plain per-(GPU,
// XID) window merged them into one, and the repeat rule never saw them).
class XidDeduper {
 public:
  explicit XidDeduper(common::Duration window = std::chrono::seconds(10)) : window_(window) {}
  // Fresh: the first copy of an occurrence. (XID 154's copies pair too:
  // NVML's event, which names no action, waits for the log's line that
  // does; the agent judges that one.)
  bool Fresh(XidSource source, uint32_t gpu, uint32_t xid, common::TimePoint now);

 private:
  struct Copy {
    XidSource source;
    common::TimePoint at;
  };
  const common::Duration window_;
  // Copies not yet paired with the other source's, oldest first.
  std::map<std::pair<uint32_t, uint32_t>, std::deque<Copy>> unpaired_;
};

}  // namespace gpuha::gpu
