#include "common/prometheus.h"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpuha::common {

std::string PromEscape(absl::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void PromText::Family(absl::string_view name, absl::string_view type, absl::string_view help) {
  absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void PromText::Sample(absl::string_view name, const PromLabels& labels, double value) {
  absl::StrAppend(&out_, name);
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&out_, i ? "," : "", labels[i].first, "=\"", PromEscape(labels[i].second),
                      "\"");
    }
    out_ += '}';
  }
  if (std::isnan(value)) {
    out_ += " NaN\n";
  } else if (std::isinf(value)) {
    out_ += value > 0 ? " +Inf\n" : " -Inf\n";
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    absl::StrAppend(&out_, " ", static_cast<int64_t>(value), "\n");
  } else {
    // The shortest text that reads back as the same double: "%.6g" once
    // turned a start time of 1796220000.5 s into 1.79622e+09, 5000 s off.
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, value);
    absl::StrAppend(&out_, " ", absl::string_view(buf, static_cast<size_t>(r.ptr - buf)), "\n");
  }
}

void PromText::Histogram(absl::string_view name, const PromLabels& labels, const double* bounds,
                         const uint64_t* counts, size_t n_bounds, double sum) {
  const std::string bucket = absl::StrCat(name, "_bucket");
  PromLabels with_le = labels;
  with_le.emplace_back("le", "");
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= n_bounds; ++i) {
    cumulative += counts[i];
    if (i < n_bounds) {
      char buf[32];
      auto r = std::to_chars(buf, buf + sizeof buf, bounds[i]);
      with_le.back().second.assign(buf, r.ptr);
    } else {
      with_le.back().second = "+Inf";
    }
    Sample(bucket, with_le, double(cumulative));
  }
  Sample(absl::StrCat(name, "_sum"), labels, sum);
  Sample(absl::StrCat(name, "_count"), labels, double(cumulative));
}

namespace {

// The process's start, in seconds since the epoch: its start time in clock
// ticks after boot (/proc/self/stat field 22) plus the boot time
// (/proc/stat btime). 0 when either cannot be read.
double ProcessStartSeconds() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  size_t close = line.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  // Fields from the 3rd (state) on; starttime is the 22nd.
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i != 22) continue;
    std::ifstream boot("/proc/stat");
    std::string key;
    double btime = 0;
    while (boot >> key) {
      if (key == "btime") {
        boot >> btime;
        break;
      }
    }
    if (btime == 0) return 0;
    return btime + std::stod(field) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return 0;
}

}  // namespace

void AppendProcessFamilies(absl::string_view component, PromText* p) {
  p->Family("gpuha_build_info", "gauge", "1, labelled with the component and gpuha's version.");
  p->Sample("gpuha_build_info", {{"component", std::string(component)}, {"version", GPUHA_VERSION}},
            1);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  p->Family("process_cpu_seconds_total", "counter", "Total user and system CPU time, seconds.");
  p->Sample("process_cpu_seconds_total", {},
            double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
  long pages_virtual = 0, pages_resident = 0;
  std::ifstream statm("/proc/self/statm");
  statm >> pages_virtual >> pages_resident;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  p->Family("process_resident_memory_bytes", "gauge", "Resident memory size, bytes.");
  p->Sample("process_resident_memory_bytes", {}, double(pages_resident) * page);
  p->Family("process_virtual_memory_bytes", "gauge", "Virtual memory size, bytes.");
  p->Sample("process_virtual_memory_bytes", {}, double(pages_virtual) * page);
  std::error_code ec;
  double fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++fds;
  }
  p->Family("process_open_fds", "gauge", "Open file descriptors.");
  p->Sample("process_open_fds", {}, fds);
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  p->Family("process_max_fds", "gauge", "Maximum number of open file descriptors.");
  p->Sample("process_max_fds", {}, double(nofile.rlim_cur));
  p->Family("process_start_time_seconds", "gauge",
            "Start time of the process since the Unix epoch, seconds.");
  p->Sample("process_start_time_seconds", {}, ProcessStartSeconds());
}

}  // namespace gpuha::common
