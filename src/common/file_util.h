// Whole-file reads and atomic writes, returning Status instead of throwing.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::common {

// The file's bytes; NotFound names the path when it cannot be opened.
[[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes to PATH.tmp, fsyncs, renames over PATH and fsyncs the directory, so
// a crash or a power loss leaves the old file or the new one, never half of one.
[[nodiscard]] absl::Status WriteFileAtomic(const std::string& path, absl::string_view data);

}  // namespace gpuha::common
