#include "gpu/pci_rebind.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gpu/kernel_log.h"

namespace gpuha::gpu {
namespace {

namespace fs = std::filesystem;

// "0000:3b:00.0": 4 hex, ':', 2 hex, ':', 2 hex, '.', one octal digit.
bool ValidAddress(const std::string& a) {
  if (a.size() != 12 || a[4] != ':' || a[7] != ':' || a[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(a[i]))) return false;
  }
  return a[11] >= '0' && a[11] <= '7';
}

bool ValidDriver(const std::string& d) {
  if (d.empty() || d.size() > 64) return false;
  for (char c : d) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

// A sysfs attribute is written in place, in one write(2), as `echo` does.
absl::Status WriteAttr(const fs::path& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", path.string(), ": ", std::strerror(errno)));
  }
  ssize_t n = ::write(fd, value.data(), value.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::InternalError(absl::StrCat("write '", value, "' to ", path.string(), ": ",
                                            n < 0 ? std::strerror(err) : "short write"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string SysfsPciAddress(const std::string& bus_id) {
  const std::string slot = PciSlot(bus_id);
  const size_t dot = bus_id.rfind('.');
  if (slot.empty()) return "";
  return slot + (dot == std::string::npos ? ".0" : absl::AsciiStrToLower(bus_id.substr(dot)));
}

absl::StatusOr<std::string> BoundDriver(const std::string& sysfs_pci, const std::string& address) {
  if (!ValidAddress(address)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PCI address '", absl::CHexEscape(address), "' is not DDDD:BB:DD.F"));
  }
  const fs::path dev = fs::path(sysfs_pci) / "devices" / address;
  std::error_code ec;
  if (!fs::exists(dev, ec)) {
    return absl::NotFoundError(absl::StrCat("no PCI device ", address, " under ", sysfs_pci));
  }
  fs::path link = fs::read_symlink(dev / "driver", ec);
  if (ec) return std::string();  // no driver bound
  return link.filename().string();
}

absl::Status RebindPci(const std::string& sysfs_pci, const std::string& address,
                       const std::string& driver) {
  if (!ValidDriver(driver)) {
    return absl::InvalidArgumentError(
        absl::StrCat("driver '", absl::CHexEscape(driver), "' is not a driver name"));
  }
  absl::StatusOr<std::string> bound = BoundDriver(sysfs_pci, address);
  if (!bound.ok()) return bound.status();
  const fs::path dev = fs::path(sysfs_pci) / "devices" / address;
  const fs::path drv = fs::path(sysfs_pci) / "drivers" / driver;
  std::error_code ec;
  if (!fs::exists(drv / "bind", ec)) {
    return absl::NotFoundError(
        absl::StrCat("no driver ", driver, " under ", sysfs_pci, " (is its module loaded?)"));
  }
  if (absl::Status s = WriteAttr(dev / "driver_override", driver); !s.ok()) return s;
  if (!bound->empty()) {
    if (absl::Status s = WriteAttr(dev / "driver" / "unbind", address); !s.ok()) return s;
  }
  if (absl::Status s = WriteAttr(drv / "bind", address); !s.ok()) return s;
  absl::StatusOr<std::string> now = BoundDriver(sysfs_pci, address);
  if (!now.ok()) return now.status();
  if (*now != driver) {
    return absl::FailedPreconditionError(
        absl::StrCat(address, " is bound to '", *now, "' after binding it to ", driver));
  }
  return absl::OkStatus();
}

}  // namespace gpuha::gpu
