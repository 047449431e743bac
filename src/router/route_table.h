// RouteTable: one immutable version of every stream's primary and standby.
// A new version replaces the old as a whole (shared_ptr swap); a request keeps
// the table it started with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpuha/v1/routes.pb.h"
#include "router/router_config.h"

namespace gpuha::router {

struct Upstream {
  std::string node;            // controller's node name (the address for static routes)
  std::string address;         // HOST:PORT
  std::string grpc_address{};  // HOST:PORT of its KServe v2 gRPC port; empty: none
  bool empty() const { return address.empty(); }
};

struct RouteEntry {
  std::string stream;
  std::string tenant;
  Upstream primary;  // empty: the stream fits nowhere now (503)
  Upstream standby;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

class RouteTable {
 public:
  static std::shared_ptr<const RouteTable> FromSnapshot(const v1::RouteSnapshot& s);
  static std::shared_ptr<const RouteTable> FromStatic(const std::vector<StaticRoute>& routes);

  uint64_t version() const { return version_; }
  uint64_t epoch() const { return epoch_; }
  const RouteEntry* Find(std::string_view stream) const;
  // Every distinct upstream address, for the prober.
  const std::vector<Upstream>& upstreams() const { return upstreams_; }
  size_t size() const { return streams_.size(); }
  const std::unordered_map<std::string, RouteEntry, StringHash, std::equal_to<>>& streams() const {
    return streams_;
  }

 private:
  void Index();
  uint64_t version_ = 0;
  uint64_t epoch_ = 0;
  std::unordered_map<std::string, RouteEntry, StringHash, std::equal_to<>> streams_;
  std::vector<Upstream> upstreams_;
};

}  // namespace gpuha::router
