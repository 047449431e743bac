#include "cli/router_command.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

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
  app_->add_flag("--background", background_,
                 "With a handoff socket: return once this router serves (exit 0; 1 if it "
                 "cannot), leaving it running, and tell systemd it is the service's main "
                 "process (MAINPID=): the unit's ExecReload, a restart that refuses no "
                 "connection");
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
  auto config = Load(config_path_, listen_, admin_, controllers_, threads_);
  if (config.ok() && !handoff_socket_.empty()) config->handoff_socket = handoff_socket_;
  if (!config.ok()) {
    spdlog::error("router: {}", config.status().message());
    return kExitBadInput;
  }
  if (background_ && config->handoff_socket.empty()) {
    spdlog::error(
        "router: --background: needs a handoff socket (--handoff-socket or "
        "handoff_socket), whose router it replaces");
    return kExitBadInput;
  }
  // --background: the parent waits for the child's word that it serves,
  // and returns; the child goes on as the router. Forked before any thread.
  int serving_fd = -1;
  if (background_ && !check_) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      spdlog::error("router: --background: pipe: {}", std::strerror(errno));
      return kExitFailure;
    }
    const pid_t child = ::fork();
    if (child < 0) {
      spdlog::error("router: --background: fork: {}", std::strerror(errno));
      return kExitFailure;
    }
    if (child > 0) {
      ::close(fds[1]);
      char word = 0;
      ssize_t n = 0;
      do {
        n = ::read(fds[0], &word, 1);
      } while (n < 0 && errno == EINTR);
      ::close(fds[0]);
      return n == 1 && word == 'R' ? kExitOk : kExitFailure;
    }
    ::close(fds[0]);
    ::setsid();
    serving_fd = fds[1];
  }
  StopSignals signals(/*reload=*/true);
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
  if (serving_fd >= 0) {
    // Serving is ready: the listeners taken and routes held (the old
    // router drains only then). Not so in 30 s: the old one serves on.
    for (int i = 0; i < 600 && !r.Ready(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string why;
    if (!r.Ready(&why)) {
      spdlog::error(
          "router: --background: not ready after 30 s ({}); the running router "
          "serves on",
          why);
      r.Stop();
      return kExitFailure;  // the parent reads the pipe's end: exit 1
    }
  }
  common::SdNotifyOrLog(
      absl::StrCat(serving_fd >= 0 ? absl::StrCat("MAINPID=", ::getpid(), "\n") : std::string(),
                   "READY=1\nSTATUS=router on ", config->listen.host, ":", r.port(), " admin ",
                   config->admin.host, ":", r.admin_port()));
  if (serving_fd >= 0) {
    (void)!::write(serving_fd, "R", 1);
    ::close(serving_fd);
  }
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
