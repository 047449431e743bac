#include "controller/standby_server.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "controller/operator_api.h"

namespace gpuha::controller {

using nlohmann::json;
using std::chrono::milliseconds;

// A standby's routes: the snapshot of the state it last read, under the
// leader's epoch and route version, marked as a standby's so that routers
// go on looking for the leader (their hints and acks count only there).
class StandbyServer::StandbyRoutes final : public RouteSource {
 public:
  // nullopt: none to serve (not read, or unreadable); streams end.
  void Set(std::optional<v1::RouteSnapshot> snap) {
    {
      absl::MutexLock lock(&mu_);
      // Compared whole: a reload that finds other routes sends them, even
      // under the same epoch and version.
      if (snap && (!snap_ || snap->SerializeAsString() != snap_->SerializeAsString())) {
        ++generation_;
      }
      snap_ = std::move(snap);
    }
  }
  bool Serving() const override {
    absl::MutexLock lock(&mu_);
    return snap_.has_value();
  }
  // The mark is the generation: routes that differ from the last ones held.
  std::optional<v1::RouteSnapshot> Next(uint64_t* sent, common::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    const uint64_t seen = *sent;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return snap_.has_value() && generation_ != seen;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&changed), absl::FromChrono(timeout))) {
      return std::nullopt;
    }
    *sent = generation_;
    return snap_;
  }
  // A standby acts on nothing a router says: its suspects and acks are for
  // the leader, which the router goes on to find. A router that does not
  // know standby routes is sent on at once.
  absl::Status Hello(const std::string&, const v1::RouteAck& first) override {
    if (first.takes_standby_routes()) return absl::OkStatus();
    return absl::UnavailableError(
        "this controller stands by; a router that takes standby routes may watch here, this one "
        "goes on to the leader");
  }
  void Ack(const std::string&, const v1::RouteAck&) override {}
  void Gone(const std::string&) override {}

 private:
  mutable absl::Mutex mu_;
  std::optional<v1::RouteSnapshot> snap_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // counts changes of snap_
};

// Agents heartbeat to the leader only: a standby ends their stream at once,
// and they try the next listed controller.
class StandbyServer::RefuseAgents final : public v1::AgentService::Service {
 public:
  explicit RefuseAgents(StandbyServer* s) : s_(s) {}
  grpc::Status Connect(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>*) override {
    std::string leader;
    {
      absl::MutexLock lock(&s_->mu_);
      leader = s_->leader_;
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("this controller stands by (",
                                     leader.empty() ? "no controller leads now"
                                                    : absl::StrCat("the leader is ", leader),
                                     "); agents heartbeat to the leader"));
  }

 private:
  StandbyServer* const s_;
};

StandbyServer::StandbyServer(const ControllerConfig& config) : config_(config) {}

StandbyServer::~StandbyServer() { Stop(); }

absl::Status StandbyServer::Start() {
  auto hp = common::ParseHostPort(config_.http_listen, "listen.http");
  if (!hp.ok()) return hp.status();
  route_source_ = std::make_unique<StandbyRoutes>();
  routes_ = RouteWatchService(route_source_.get(), &stopping_);
  agents_ = std::make_unique<RefuseAgents>(this);
  auto grpc = StartGrpc(config_, {agents_.get(), routes_.get()}, &grpc_port_);
  if (!grpc.ok()) return grpc.status();
  grpc_ = std::move(*grpc);
  auto http =
      common::HttpServer::Start({.address = hp->host, .port = hp->port},
                                [this](const common::HttpRequest& r) { return HandleHttp(r); });
  if (!http.ok()) return http.status();
  http_ = std::move(*http);
  return absl::OkStatus();
}

void StandbyServer::Stop() {
  // Routers on this standby go on to the next controller; listen.grpc and
  // listen.http are free for the leader this process may now be.
  stopping_ = true;
  if (route_source_) route_source_->Set(std::nullopt);  // wakes the route streams
  if (grpc_) grpc_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  grpc_.reset();
  if (http_) http_->Stop();
}

void StandbyServer::Set(std::shared_ptr<Controller> state, std::string leader, std::string error) {
  // Routes only from a state read, with a route version the leader wrote.
  std::optional<v1::RouteSnapshot> routes;
  if (state != nullptr && state->route_version() != 0) {
    routes = state->Snapshot();
    routes->set_standby(true);
    routes->set_leader(leader);
  }
  {
    absl::MutexLock lock(&mu_);
    state_ = std::move(state);
    leader_ = std::move(leader);
    error_ = std::move(error);
  }
  if (route_source_) route_source_->Set(std::move(routes));
}

common::HttpResponse StandbyServer::HandleHttp(const common::HttpRequest& r) {
  std::shared_ptr<Controller> state;
  std::string leader, error;
  {
    absl::MutexLock lock(&mu_);
    state = state_;
    leader = leader_;
    error = error_;
  }
  if (r.path == "/livez") return JsonResponse(200, {{"ok", true}});
  if (r.path == "/metrics") {
    // Only what a standby knows: the leader's own page has the fleet's
    // figures, and a standby repeating them would count them twice.
    common::PromText p;
    p.Family("gpuha_controller_leader", "gauge", kLeaderHelp);
    p.Sample("gpuha_controller_leader", {{"store", "etcd"}}, 0);
    p.Family("gpuha_controller_store_up", "gauge", kStoreUpHelp);
    p.Sample("gpuha_controller_store_up", {{"store", "etcd"}}, error.empty() ? 1 : 0);
    common::AppendProcessFamilies("controller", &p);
    return common::HttpResponse{200, common::PromText::kContentType, p.str(), {}};
  }
  json who = {{"ok", false}, {"leading", false}, {"role", "standby"}};
  if (!leader.empty()) who["leader"] = leader;
  if (!error.empty()) who["error"] = error;
  if (r.path == "/healthz") return JsonResponse(503, who);
  const bool api = r.path.rfind("/api/v1/", 0) == 0;
  // Writes go to the leader; 307 keeps the method and the body. So do the
  // views that only the leader's memory holds (routers, traffic history).
  if (api && (r.method != "GET" || r.path == "/api/v1/routers" || r.path == "/api/v1/history")) {
    if (leader.empty()) {
      who["error"] = error.empty() ? "no controller leads now; try again" : error;
      return JsonResponse(503, who);
    }
    common::HttpResponse redirect = JsonResponse(307, who);
    const std::string base = absl::StrContains(leader, "://") ? leader : "http://" + leader;
    redirect.headers.push_back({"Location", base + r.target});
    return redirect;
  }
  if (api && state == nullptr) {
    who["error"] =
        absl::StrCat("this standby has not read the store: ", error.empty() ? "not yet" : error);
    return JsonResponse(503, who);
  }
  return OperatorApi(state.get(), config_, r, {{"role", "standby"}, {"leader", leader}});
}

}  // namespace gpuha::controller
