#include "controller/router_acks.h"

namespace gpuha::controller {

bool RouterAcks::Ack(const std::string& router, uint64_t version, uint64_t current) {
  held_[router] = version;
  if (version != current || said_ == version) return false;
  for (const auto& [name, held] : held_) {
    if (held != current) return false;
  }
  said_ = version;
  return true;
}

}  // namespace gpuha::controller
