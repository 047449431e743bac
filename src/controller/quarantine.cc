#include "controller/quarantine.h"

#include <cmath>

namespace gpuha::controller {

bool QuarantineAllows(double max_share, int64_t out, int64_t all) {
  if (max_share >= 1) return true;
  // 1e-9: 0.3 of 10 is 3, not the 2.9999... floating point makes it.
  const auto allowed =
      static_cast<int64_t>(std::floor(max_share * static_cast<double>(all) + 1e-9));
  return out == 0 || out + 1 <= allowed;
}

}  // namespace gpuha::controller
