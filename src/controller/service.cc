#include "controller/service.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/heartbeat_datagram.h"
#include "common/log.h"
#include "common/net_util.h"
#include "common/prometheus.h"
#include "controller/operator_api.h"

namespace gpuha::controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

class AgentReactor;

// What the controller holds for one agent stream. Send() may be called under
// the controller's lock from any thread: it queues, and starts a write when
// none is in flight. Once the stream is done, sends are dropped.
class ReactorSink : public AgentSink {
 public:
  explicit ReactorSink(AgentReactor* r) : reactor_(r) {}
  void Send(const v1::ControllerMessage& m) override;
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  friend class AgentReactor;
  absl::Mutex mu_;
  AgentReactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::ControllerMessage> outbox_ ABSL_GUARDED_BY(mu_);  // front is being written
};

// One agent's heartbeat stream on gRPC's callback API: no thread per agent,
// so two thousand agents cost the controller a few pool threads.
//
// Who may speak for a node (Kubernetes' NodeRestriction): with mTLS, only a
// certificate whose CN or a SAN is the node's name, and the newest such
// stream replaces an older one (a reconnect); without mTLS, nothing proves
// a name, so a second stream for a node whose agent is connected is refused
// and logged (an impostor once took a node's fences).
class AgentReactor : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage> {
 public:
  // `identities`: the peer certificate's CN and SANs; nullopt without mTLS.
  AgentReactor(Controller* c, std::optional<std::vector<std::string>> identities,
               std::string peer_ip)
      : controller_(c),
        identities_(std::move(identities)),
        peer_ip_(std::move(peer_ip)),
        sink_(std::make_shared<ReactorSink>(this)) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return Done(grpc::Status::OK);
    if (node_.empty()) {
      if (!in_.has_hello() || in_.hello().node().empty()) {
        return Done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "the first message must be a hello naming the node"));
      }
      const std::string& node = in_.hello().node();
      if (identities_ &&
          std::find(identities_->begin(), identities_->end(), node) == identities_->end()) {
        spdlog::warn("controller: refused an agent claiming node '{}' with a certificate for [{}]",
                     absl::CHexEscape(node), absl::StrJoin(*identities_, ", "));
        return Done(grpc::Status(
            grpc::StatusCode::PERMISSION_DENIED,
            absl::StrCat("the client certificate does not name node '", node, "' (CN or SAN)")));
      }
      if (absl::Status s = controller_->AgentConnected(
              in_.hello(), sink_, /*proven=*/identities_.has_value(), peer_ip_);
          !s.ok()) {
        // The absl and gRPC codes share their numbers; the agent logs the
        // message and retries.
        // A guesser's refusals past the throttle are counted
        // (join_tokens_throttled), not logged one by one.
        if (s.code() != absl::StatusCode::kResourceExhausted) {
          spdlog::warn("controller: agent refused: {}", s.message());
        }
        return Done(
            grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message())));
      }
      node_ = node;
    } else if (in_.has_heartbeat()) {
      controller_->AgentHeartbeat(node_, in_.heartbeat(), sink_.get());
    } else if (in_.has_goodbye()) {
      controller_->AgentGoodbye(node_, sink_.get(), in_.goodbye());
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&sink_->mu_);
    sink_->outbox_.pop_front();
    if (!ok || finishing_) sink_->outbox_.clear();  // a broken or ending stream writes no more
    if (finishing_) {
      if (!finished_) {
        finished_ = true;
        Finish(final_);
      }
      return;
    }
    if (!sink_->outbox_.empty()) StartWrite(&sink_->outbox_.front());
  }
  void OnDone() override {
    sink_->Detach();
    delete this;
  }
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink_->mu_) {
    if (!finishing_ && sink_->outbox_.size() == 1) StartWrite(&sink_->outbox_.front());
  }

 private:
  // The stream ended (agent gone, or refused): tell the controller, then
  // finish once no write is in flight.
  void Done(grpc::Status status) {
    if (!node_.empty()) controller_->AgentDisconnected(node_, sink_.get());
    absl::MutexLock lock(&sink_->mu_);
    finishing_ = true;
    final_ = std::move(status);
    if (sink_->outbox_.empty() && !finished_) {
      finished_ = true;
      Finish(final_);
    }
  }
  Controller* const controller_;
  const std::optional<std::vector<std::string>> identities_;
  const std::string peer_ip_;  // where the stream comes from (empty: unknown)
  std::shared_ptr<ReactorSink> sink_;
  v1::AgentMessage in_;
  std::string node_;
  bool finishing_ ABSL_GUARDED_BY(sink_->mu_) = false;
  bool finished_ ABSL_GUARDED_BY(sink_->mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(sink_->mu_);
};

// The analysis cannot see that reactor_->sink_ is this sink: WriteLocked's
// lock is the one held here.
void ReactorSink::Send(const v1::ControllerMessage& m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  absl::MutexLock lock(&mu_);
  if (reactor_ == nullptr) return;
  outbox_.push_back(m);
  reactor_->WriteLocked();
}

}  // namespace

class ControllerServer::AgentServiceImpl final : public v1::AgentService::CallbackService {
 public:
  AgentServiceImpl(Controller* c, bool mtls) : controller_(c), mtls_(mtls) {}
  grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage>* Connect(
      grpc::CallbackServerContext* ctx) override {
    std::optional<std::vector<std::string>> identities;
    if (mtls_) {
      identities.emplace();
      std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
      for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
          identities->emplace_back(v.data(), v.size());
        }
      }
    }
    return new AgentReactor(controller_, std::move(identities), common::GrpcPeerIp(ctx->peer()));
  }

 private:
  Controller* const controller_;
  const bool mtls_;
};

namespace {

// The leader's routes: a new snapshot with each new route version.
class LeaderRoutes final : public RouteSource {
 public:
  explicit LeaderRoutes(Controller* c) : c_(c) {}
  bool Serving() const override { return c_->acting(); }
  // The mark is the route version: a new one, new routes.
  std::optional<v1::RouteSnapshot> Next(uint64_t* sent, common::Duration timeout) override {
    if (*sent != 0 && c_->WaitForRoutes(*sent, timeout) == *sent) return std::nullopt;
    v1::RouteSnapshot snap = c_->Snapshot();
    *sent = snap.version();
    return snap;
  }
  absl::Status Hello(const std::string& router, const v1::RouteAck& first) override {
    c_->RouterHello(router, first.epoch(), first.version());
    return absl::OkStatus();
  }
  void Ack(const std::string& router, const v1::RouteAck& ack) override {
    c_->RouterAck(router, ack.version(), {ack.suspect_nodes().begin(), ack.suspect_nodes().end()},
                  ack.has_stats() ? &ack.stats() : nullptr);
  }
  void Gone(const std::string& router) override { c_->RouterGone(router); }

 private:
  Controller* const c_;
};

}  // namespace

ControllerServer::ControllerServer(Controller* controller, const ControllerConfig& config)
    : controller_(controller), config_(config) {}

ControllerServer::~ControllerServer() { Stop(); }

absl::Status ControllerServer::Start() {
  agents_ = std::make_unique<AgentServiceImpl>(
      controller_, !config_.tls_cert.empty() && !config_.tls_ca.empty());
  route_source_ = std::make_unique<LeaderRoutes>(controller_);
  routes_ = RouteWatchService(route_source_.get(), &stopping_);
  auto grpc = StartGrpc(config_, {agents_.get(), routes_.get()}, &grpc_port_);
  if (!grpc.ok()) return grpc.status();
  grpc_ = std::move(*grpc);
  // Without HMAC-SHA256 in this OpenSSL no datagram can be verified: none
  // are offered (checked once here, not at each agent's welcome).
  absl::StatusOr<std::unique_ptr<common::DatagramKey>> can_sign =
      common::DatagramKey::Create(common::RandomBytes(common::kDatagramKeyBytes));
  if (config_.heartbeat_datagrams && !can_sign.ok()) {
    spdlog::warn("controller: heartbeat datagrams off: {}", can_sign.status().message());
  }
  if (config_.heartbeat_datagrams && can_sign.ok()) {
    absl::StatusOr<common::HostPort> at = common::ParseHostPort(config_.grpc_listen, "listen.grpc");
    if (!at.ok()) return at.status();
    at->port = static_cast<uint16_t>(grpc_port_);
    auto rx = common::UdpReceiver::Start(
        *at, [this](absl::string_view d) { OnDatagram(d); },
        [this](uint64_t dropped) { controller_->CountDatagramDrops(dropped); });
    if (rx.ok()) {
      datagrams_ = std::move(*rx);
      controller_->SetDatagramPort(datagrams_->port());
    } else {
      // Not fatal: agents are offered no datagrams and beat on their streams.
      spdlog::warn("controller: heartbeat datagrams off: {}", rx.status().message());
    }
  }
  std::vector<std::string> hp = absl::StrSplit(config_.http_listen, absl::MaxSplits(':', 1));
  uint32_t port = 0;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen.http: '", config_.http_listen, "' is not HOST:PORT"));
  }
  auto http =
      common::HttpServer::Start({.address = hp[0], .port = static_cast<uint16_t>(port)},
                                [this](const common::HttpRequest& r) { return HandleHttp(r); });
  if (!http.ok()) return http.status();
  http_ = std::move(*http);
  ticker_ = std::thread([this] {
    while (!stopping_) {
      controller_->Tick();
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  return absl::OkStatus();
}

void ControllerServer::Stop() {
  if (stopping_.exchange(true)) return;
  // Agents and routers first: a tick may sit on the controller's lock in a
  // hung store write (a deposed leader), and its agents must go on to the
  // new leader meanwhile. (The datagram thread may wait on that lock too.)
  if (grpc_) grpc_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  if (datagrams_) datagrams_->Stop();
  if (ticker_.joinable()) ticker_.join();
  if (http_) http_->Stop();
}

void ControllerServer::OnDatagram(absl::string_view datagram) {
  absl::Status s = controller_->AgentDatagram(datagram);
  if (s.ok() || s.code() == absl::StatusCode::kUnavailable) return;  // deposed: not ours to judge
  // A late duplicate of a beat its stream brought is no news.
  if (s.code() == absl::StatusCode::kAlreadyExists) return;
  ++refusals_unlogged_;
  const auto now = std::chrono::steady_clock::now();
  if (now - refusal_logged_ < std::chrono::seconds(10)) return;
  spdlog::warn("controller: refused a heartbeat datagram: {} ({} refused since the last report)",
               s.message(), refusals_unlogged_);
  refusal_logged_ = now;
  refusals_unlogged_ = 0;
}

common::HttpResponse ControllerServer::HandleHttp(const common::HttpRequest& r) {
  // /livez: the process answers. /healthz: it leads and acts, as probes and
  // load balancers in front of several controllers want it.
  if (r.path == "/livez") return JsonResponse(200, {{"ok", true}});
  // A deposed controller answers nothing as if it led: probes, clients and
  // ctl go on to the controller that does.
  if (!controller_->acting() && (r.path == "/healthz" || r.path.rfind("/api/v1/", 0) == 0)) {
    return JsonResponse(503, {{"ok", false},
                              {"leading", false},
                              {"error", "this controller no longer leads; it is stopping"}});
  }
  if (r.path == "/healthz")
    return JsonResponse(200, {{"ok", true}, {"leading", true}, {"epoch", controller_->epoch()}});
  if (r.path == "/metrics") {
    common::HttpResponse m;
    m.content_type = common::PromText::kContentType;
    m.body = controller_->MetricsText();
    return m;
  }
  return OperatorApi(controller_, config_, r);
}

}  // namespace gpuha::controller
