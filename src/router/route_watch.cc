#include "router/route_watch.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/file_util.h"
#include "common/log.h"
#include "gpuha/v1/routes.grpc.pb.h"

namespace gpuha::router {

using std::chrono::milliseconds;

RouteWatch::RouteWatch(Router* router, const RouterConfig& config)
    : router_(router), config_(config) {}

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
  common::Backoff backoff({.initial = milliseconds(100),
                           .max = milliseconds(2000),
                           .stable_after = milliseconds(5000),
                           .jitter = 0.2,
                           .seed = std::hash<std::string>()(config_.router_id)});
  size_t next = 0;
  while (!stopping_) {
    const common::HostPort& c = config_.controllers[next++ % config_.controllers.size()];
    auto started = std::chrono::steady_clock::now();
    absl::Status s = WatchOnce(c);
    if (stopping_) break;
    backoff.MaybeReset(started, std::chrono::steady_clock::now());
    auto wait = backoff.Next();
    spdlog::warn("router: route watch on {}: {}; keeping routes v{}, retrying in {} ms", c.str(),
                 s.message(), router_->routes() ? router_->routes()->version() : 0,
                 common::ToMillis(wait));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [&] { return stopping_.load(); });
  }
}

absl::Status RouteWatch::WatchOnce(const common::HostPort& controller) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!config_.controller_ca.empty()) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = common::ReadFile(config_.controller_ca).value_or("");
    if (!config_.controller_cert.empty()) {
      o.pem_cert_chain = common::ReadFile(config_.controller_cert).value_or("");
      o.pem_private_key = common::ReadFile(config_.controller_key).value_or("");
    }
    creds = grpc::SslCredentials(o);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto channel = grpc::CreateCustomChannel(controller.str(), creds, args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + milliseconds(1000))) {
    return absl::UnavailableError("unreachable (no connection within 1 s)");
  }
  auto stub = v1::RouteService::NewStub(channel);
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
  std::mutex write_mu;  // the reader acks; the hint thread sends suspects
  bool ok = stream->Write(hello);
  std::atomic<bool> done{false};
  std::thread hints;
  if (ok) {
    connected_ = true;
    spdlog::info("router: watching routes on controller {}", controller.str());
    // Suspects go out at once, not only with the next snapshot's ack.
    hints = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!done && !stopping_) {
        cv_.wait_for(lock, milliseconds(20));
        std::vector<std::string> s = router_->TakeSuspects();
        if (s.empty()) continue;
        v1::RouteAck ack;
        ack.set_router(config_.router_id);
        ack.set_version(router_->routes() ? router_->routes()->version() : 0);
        for (auto& n : s) ack.add_suspect_nodes(n);
        lock.unlock();
        bool written;
        {
          std::lock_guard<std::mutex> w(write_mu);
          written = stream->Write(ack);
        }
        lock.lock();
        if (!written) break;
      }
    });
    v1::RouteSnapshot snap;
    while (stream->Read(&snap)) {
      if (absl::Status s = router_->SetRoutes(RouteTable::FromSnapshot(snap)); !s.ok()) {
        spdlog::warn("router: {}; kept", s.message());
      } else {
        spdlog::info("router: routes v{} (epoch {}, {} streams)", snap.version(), snap.epoch(),
                     snap.routes_size());
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
  ctx.TryCancel();
  if (hints.joinable()) hints.join();
  grpc::Status st = stream->Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = nullptr;
  }
  if (stopping_) return absl::CancelledError("stopping");
  return absl::UnavailableError(st.ok() ? "closed the stream"
                                        : absl::StrCat("stream broke: ", st.error_message()));
}

}  // namespace gpuha::router
