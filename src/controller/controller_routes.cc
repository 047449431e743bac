// The routes the controller serves its routers: the snapshot, the watch's
// wait for a new version, and what routers say back (acks with suspects and
// traffic, the epoch they hold, their leaving).
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"
#include "common/net_util.h"
#include "controller/controller.h"
#include "controller/state_codec.h"

namespace gpuha::controller {

v1::RouteSnapshot Controller::Snapshot() const {
  absl::MutexLock lock(&mu_);
  v1::RouteSnapshot snap;
  snap.set_version(route_version_);
  snap.set_epoch(epoch_);
  auto endpoint = [&](const std::string& unit, v1::Endpoint* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (unit.empty()) return;
    e->set_node(unit);
    const NodeConfig& cfg = nodes_.at(NodeOfUnit(unit)).cfg;
    e->set_address(UnitAddress(cfg, unit));
    e->set_grpc_address(UnitGrpcAddress(cfg, unit));
  };
  for (const Assignment& a : placement_.Assignments()) {
    v1::Route* r = snap.add_routes();
    const StreamSpec& s = specs_.at(a.stream);
    r->set_stream(a.stream);
    r->set_tenant(s.tenant);
    r->set_weight(static_cast<uint64_t>(s.weight));
    endpoint(a.primary, r->mutable_primary());
    endpoint(a.standby, r->mutable_standby());
  }
  for (const auto& [id, n] : nodes_) {
    for (const NodeSpec& unit : UnitSpecs(n.cfg)) {
      if (placement_.Available(unit.id) && placement_.RoleOf(unit.id) != Role::kPassive) {
        endpoint(unit.id, snap.add_active());
      }
    }
  }
  return snap;
}

uint64_t Controller::route_version() const {
  absl::MutexLock lock(&mu_);
  return route_version_;
}

uint64_t Controller::WaitForRoutes(uint64_t known, common::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (route_version_ == known && acting()) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= common::Duration::zero()) break;
    routes_cv_.WaitWithTimeout(&mu_, absl::FromChrono(left));
  }
  return route_version_;
}

void Controller::RouterAck(const std::string& router, uint64_t version,
                           const std::vector<std::string>& suspects, const v1::RouterStats* stats) {
  if (!acting()) return;
  Step step(this);
  if (stats != nullptr) {
    traffic_.Report(router, *stats, static_cast<double>(clock_->UnixNanos()) / 1e6);
  }
  for (const std::string& s : suspects) {
    // A server per GPU is hinted by its unit ("gpu-1/gpu0"): the event and
    // the restart grace are its node's.
    const std::string node = NodeOfUnit(s);
    EventLocked("router_hint", node,
                node == s ? absl::StrCat("from ", router) : absl::StrCat(s, " from ", router));
    // During a planned restart the routers are the node's only witnesses.
    // (Of its node-wide server: one GPU's server failing then does not take
    // the whole node out; its agent judges that GPU when it is back.)
    NodeState* n = node == s ? FindLocked(node) : nullptr;
    if (n != nullptr && n->restart_until) {
      n->restart_until.reset();
      TakeOutLocked(
          *n, absl::StrCat("router ", router, " saw its server fail while its agent restarted"), 0,
          /*make_before_break=*/false, /*count_failure=*/true, NodeLifecycle::kFenced);
    }
  }
  // After the suspects: one of them may have moved the routes on (a node
  // in its restart grace taken out), and then this ack is of old ones.
  if (router_acks_.Ack(router, version, route_version_)) {
    EventLocked(
        "routers_acked", "",
        absl::StrCat("version ", version, " by ", router_acks_.held().size(), " router(s)"));
  }
}

void Controller::RouterHello(const std::string& router, uint64_t held_epoch,
                             uint64_t held_version) {
  if (!acting()) return;
  Step step(this);
  if (!acting()) return;
  // The router refuses only routes older than those it holds: of an older
  // epoch, or of this epoch with a lower version (this controller's earlier
  // incarnation, whose epoch write was lost). Routes of this very version,
  // from this leader or a standby, are taken. An epoch past kMaxEpoch is no
  // epoch a controller gave (Recover would refuse to read it back): ignored.
  if (held_epoch < epoch_ || held_epoch >= kMaxEpoch) return;
  if (held_epoch == epoch_ && held_version <= route_version_) return;
  AdvanceEpochLocked(held_epoch,
                     absl::StrCat("router ", router, " holds routes of epoch ", held_epoch));
}

void Controller::RouterGone(const std::string& router) {
  if (!acting()) return;
  Step step(this);
  router_acks_.Gone(router);
  traffic_.Forget(router);
}

}  // namespace gpuha::controller
