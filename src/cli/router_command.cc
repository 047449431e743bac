#include "cli/router_command.h"

#include <time.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/exit_codes.h"
#include "cli/signals.h"
#include "common/log.h"
#include "common/sd_notify.h"
#include "router/route_watch.h"
#include "router/router.h"

namespace gpuha::cli {

RouterCommand::RouterCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("router",
                               "Data plane: routes streams, fails over to standbys, TLS, tenants");
  app_->add_option("--config", config_path_, "Router config YAML")->required();
  app_->add_option("--listen", listen_,
                   "HOST:PORT for clients (overrides listen; default 127.0.0.1:8080)");
  app_->add_option(
      "--admin", admin_,
      "HOST:PORT for /metrics, /healthz, /routes (overrides admin; default 127.0.0.1:8081)");
  app_->add_flag("--check", check_, "Check the config and flags, print a summary, and exit");
  app_->add_option("--controller", controllers_,
                   "HOST:PORT[,HOST:PORT...] route watch (overrides controllers)");
  app_->add_option("--threads", threads_, "Event loops (0: one per core)")
      ->check(CLI::Range(0, 256));
  app_->add_option("--handoff-socket", handoff_socket_,
                   "Unix socket PATH: take the listeners of the router running there (a restart "
                   "or an upgrade refuses no connection; it drains and exits), and give ours to "
                   "the next (overrides handoff_socket)");
}

namespace {

absl::StatusOr<router::RouterConfig> Load(const std::string& path, const std::string& listen,
                                          const std::string& admin, const std::string& controllers,
                                          int threads) {
  auto c = router::LoadRouterConfig(path);
  if (!c.ok()) return c.status();
  if (!listen.empty()) {
    auto hp = common::ParseHostPort(listen, "--listen");
    if (!hp.ok()) return hp.status();
    c->listen = *hp;
  }
  if (!admin.empty()) {
    auto hp = common::ParseHostPort(admin, "--admin");
    if (!hp.ok()) return hp.status();
    c->admin = *hp;
  }
  if (!controllers.empty()) {
    c->controllers.clear();
    for (absl::string_view part : absl::StrSplit(controllers, ',')) {
      auto hp = common::ParseHostPort(std::string(part), "--controller");
      if (!hp.ok()) return hp.status();
      c->controllers.push_back(*hp);
    }
  }
  if (threads >= 0) c->threads = threads;
  return c;
}

}  // namespace

int RouterCommand::Run() {
  StopSignals signals(/*reload=*/true);
  auto config = Load(config_path_, listen_, admin_, controllers_, threads_);
  if (config.ok() && !handoff_socket_.empty()) config->handoff_socket = handoff_socket_;
  if (!config.ok()) {
    spdlog::error("router: {}", config.status().message());
    return kExitBadInput;
  }
  if (check_) {
    std::printf(
        "router config ok: listen %s:%u admin %s:%u, %zu tenant(s)%s, %zu controller(s), "
        "%zu static route(s)\n",
        config->listen.host.c_str(), config->listen.port, config->admin.host.c_str(),
        config->admin.port, config->tenants.size(), config->auth_none ? " (auth: none)" : "",
        config->controllers.size(), config->routes.size());
    return kExitOk;
  }
  router::Router r(*config);
  if (absl::Status s = r.Start(); !s.ok()) {
    spdlog::error("router: {}", s.message());
    return s.code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  std::unique_ptr<router::RouteWatch> watch;
  if (!config->controllers.empty()) {
    watch = std::make_unique<router::RouteWatch>(&r, *config);
    watch->Start();
  }
  std::printf("gpuha router listening on %s:%u admin %s:%u\n", config->listen.host.c_str(),
              r.port(), config->admin.host.c_str(), r.admin_port());
  std::fflush(stdout);
  common::SdNotifyOrLog(absl::StrCat("READY=1\nSTATUS=router on ", config->listen.host, ":",
                                     r.port(), " admin ", config->admin.host, ":", r.admin_port()));
  for (;;) {
    int signo = signals.WaitFor(50);
    if (signo == 0) {
      if (!r.HandedOff()) continue;
      spdlog::info("router: a new router took the listeners; draining, then stopping");
      common::SdNotifyOrLog("STOPPING=1");
      break;
    }
    if (signo != SIGHUP) {
      spdlog::info("router: signal {}, draining, then stopping", signo);
      common::SdNotifyOrLog("STOPPING=1");
      break;
    }
    // sd_notify's reload handshake: RELOADING=1 with the monotonic time,
    // READY=1 when done (what Type=notify-reload, systemd 253+, expects).
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    common::SdNotifyOrLog(absl::StrCat("RELOADING=1\nMONOTONIC_USEC=",
                                       int64_t{now.tv_sec} * 1'000'000 + now.tv_nsec / 1000));
    auto fresh = Load(config_path_, listen_, admin_, controllers_, threads_);
    absl::Status s = fresh.ok() ? r.Reload(*fresh) : fresh.status();
    if (!s.ok())
      spdlog::error("router: SIGHUP: reload refused, keeping the running config: {}", s.message());
    common::SdNotifyOrLog("READY=1");
  }
  // Routes stay watched while it drains: requests in flight may still
  // fail over to a standby the controller moves.
  r.Drain(config->limits.drain_timeout);
  if (watch) watch->Stop();
  r.Stop();
  return kExitOk;
}

}  // namespace gpuha::cli
