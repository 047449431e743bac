#include "router/route_watch.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_client.h"
#include "common/log.h"
#include "common/reconnect.h"
#include "gpuha/v1/routes.grpc.pb.h"

namespace gpuha::router {

using std::chrono::milliseconds;

RouteWatch::RouteWatch(Router* router, const RouterConfig& config, common::Clock* clock,
                       common::Duration standby_dwell)
    : router_(router), config_(config), clock_(clock), standby_dwell_(standby_dwell) {}

void RouteWatch::HoldSuspectsLocked(const std::vector<std::string>& nodes) {
  for (const std::string& n : nodes) {
    if (held_suspects_.size() >= kMaxHeldSuspects) break;
    if (std::find(held_suspects_.begin(), held_suspects_.end(), n) == held_suspects_.end()) {
      held_suspects_.push_back(n);
    }
  }
}

RouteWatch::~RouteWatch() { Stop(); }

void RouteWatch::Start() {
  thread_ = std::thread([this] { Run(); });
}

void RouteWatch::Stop() {
  stopping_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RouteWatch::Run() {
  common::ReconnectPolicy policy(config_.controllers, std::hash<std::string>()(config_.router_id));
  while (!stopping_) {
    const common::HostPort c = policy.target();
    common::TimePoint started = clock_->Now();
    absl::Status s = WatchOnce(c, policy.ConnectTimeout());
    if (stopping_) break;
    common::Duration wait = policy.Failed(started, clock_->Now(), absl::IsDeadlineExceeded(s));
    reconnects_++;
    if (absl::IsAborted(s)) {  // left a standby on purpose
      spdlog::info("router: {}; trying {} in {} ms", s.message(), policy.target().str(),
                   common::ToMillis(wait));
    } else {
      spdlog::warn("router: route watch on {}: {}; keeping routes v{}, retrying with {} in {} ms",
                   c.str(), s.message(), router_->routes() ? router_->routes()->version() : 0,
                   policy.target().str(), common::ToMillis(wait));
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [&] { return stopping_.load(); });
  }
}

absl::Status RouteWatch::WatchOnce(const common::HostPort& controller,
                                   common::Duration connect_timeout) {
  auto creds = common::ClientCredentials({.ca = config_.controller_ca,
                                          .cert = config_.controller_cert,
                                          .key = config_.controller_key,
                                          .section = "controller_tls"});
  if (!creds.ok()) return creds.status();
  auto channel = common::DialController(controller, *creds, connect_timeout, &stopping_);
  if (!channel.ok()) return channel.status();
  auto stub = v1::RouteService::NewStub(*channel);
  grpc::ClientContext ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("stopping");
    ctx_ = &ctx;
  }
  auto stream = stub->Watch(&ctx);
  v1::RouteAck hello;
  hello.set_router(config_.router_id);
  hello.set_version(router_->routes() ? router_->routes()->version() : 0);
  hello.set_epoch(router_->routes() ? router_->routes()->epoch() : 0);
  hello.set_takes_standby_routes(true);
  std::mutex write_mu;  // the reader acks; the hint thread sends suspects
  bool ok = stream->Write(hello);
  std::atomic<bool> done{false};
  std::atomic<bool> leaving{false};  // this standby was left to find the leader
  // Who is on the other end, as its last snapshot said: suspects go out only
  // to a leader (a standby, or a deposed leader that sends nothing, would
  // drop them).
  enum Peer : int { kUnknown, kStandby, kLeader };
  std::atomic<int> peer{kUnknown};
  auto now_ms = [this] { return common::ToMillis(clock_->Now().time_since_epoch()); };
  std::atomic<int64_t> standby_since_ms{0};  // when the standby's first routes came
  std::thread hints;
  absl::Status refused;  // a snapshot older than the routes held
  if (ok) {
    connected_ = true;
    spdlog::info("router: watching routes on controller {}", controller.str());
    // Suspects go out at once, not only with the next snapshot's ack; the
    // traffic figures once a second.
    hints = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu_);
      auto last_stats = std::chrono::steady_clock::now();
      while (!done && !stopping_) {
        cv_.wait_for(lock, milliseconds(20));
        HoldSuspectsLocked(router_->TakeSuspects());
        if (peer == kStandby && (!held_suspects_.empty() ||
                                 now_ms() - standby_since_ms >= common::ToMillis(standby_dwell_))) {
          // A standby acts on no hint: go and find the leader, at once if
          // there is one to give it, or once the dwell is over.
          leaving = true;
          ctx.TryCancel();
          break;
        }
        if (peer != kLeader) continue;
        std::vector<std::string> s = std::exchange(held_suspects_, {});
        const bool stats_due = std::chrono::steady_clock::now() - last_stats >= milliseconds(1000);
        if (s.empty() && !stats_due) continue;
        v1::RouteAck ack;
        ack.set_router(config_.router_id);
        for (auto& n : s) ack.add_suspect_nodes(n);
        if (stats_due) {
          *ack.mutable_stats() = router_->TrafficStats();
          last_stats = std::chrono::steady_clock::now();
        }
        lock.unlock();
        bool written;
        {
          // The version is read here, under write_mu: read earlier, a
          // snapshot applied and acked meanwhile would be followed by this
          // older version, and the controller would take the router as behind.
          std::lock_guard<std::mutex> w(write_mu);
          ack.set_version(router_->routes() ? router_->routes()->version() : 0);
          written = stream->Write(ack);
        }
        lock.lock();
        if (!written) {
          HoldSuspectsLocked(s);  // for the next controller
          break;
        }
      }
    });
    v1::RouteSnapshot snap;
    while (stream->Read(&snap)) {
      if (snap.standby() && peer != kStandby) standby_since_ms = now_ms();
      peer = snap.standby() ? kStandby : kLeader;
      on_standby_ = snap.standby();
      if (absl::Status s = router_->SetRoutes(RouteTable::FromSnapshot(snap)); !s.ok()) {
        // A controller that sends older routes than those held (a deposed
        // one) is left for the next listed controller.
        refused = s;
        break;
      } else {
        spdlog::info("router: routes v{} (epoch {}, {} streams){}", snap.version(), snap.epoch(),
                     snap.routes_size(),
                     snap.standby() ? absl::StrCat(" from a standby; the leader is ",
                                                   snap.leader().empty() ? "none" : snap.leader())
                                    : "");
      }
      v1::RouteAck ack;  // the version it holds, applied or kept
      ack.set_router(config_.router_id);
      ack.set_version(router_->routes() ? router_->routes()->version() : 0);
      std::lock_guard<std::mutex> w(write_mu);
      if (!stream->Write(ack)) break;
    }
  }
  done = true;
  cv_.notify_all();
  connected_ = false;
  on_standby_ = false;
  ctx.TryCancel();
  if (hints.joinable()) hints.join();
  grpc::Status st = stream->Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = nullptr;
  }
  if (stopping_) return absl::CancelledError("stopping");
  if (!refused.ok()) return refused;  // logged by Run; the next controller is tried
  if (leaving) {
    return absl::AbortedError(
        absl::StrCat("controller ", controller.str(), " stands by; looking for the leader"));
  }
  return absl::UnavailableError(st.ok() ? "closed the stream"
                                        : absl::StrCat("stream broke: ", st.error_message()));
}

}  // namespace gpuha::router
