#include "cli/controller_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/exit_codes.h"
#include "cli/signals.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/net_util.h"
#include "common/sd_notify.h"
#include "controller/controller.h"
#include "controller/etcd_leader.h"
#include "controller/etcd_store.h"
#include "controller/service.h"
#include "controller/standby.h"
#include "etcd/client.h"

namespace gpuha::cli {

ControllerCommand::ControllerCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("controller",
                               "Membership, failure detection, N+1 placement, failover, API");
  app_->add_option("--config", config_path_, "Controller config YAML")->required();
  app_->add_option("--grpc-listen", grpc_listen_, "HOST:PORT for agents and routers");
  app_->add_option("--http-listen", http_listen_, "HOST:PORT for the API and /metrics");
  app_->add_flag("--check", check_, "Check the config and flags, print a summary, and exit");
  app_->add_option("--store", store_path_, "SQLite file (overrides store.path)");
  app_->add_flag("--init", init_,
                 "Begin a new cluster state in a store file that exists but holds none");
}

int ControllerCommand::Run() {
  // Before anything starts a thread (NVML and gRPC do): threads inherit the mask.
  StopSignals stop_signals;
  auto config = controller::LoadControllerConfig(config_path_);
  if (!config.ok()) {
    spdlog::error("controller: {}", config.status().message());
    return kExitBadInput;
  }
  for (auto [flag, value] :
       {std::pair{"--grpc-listen", &grpc_listen_}, std::pair{"--http-listen", &http_listen_}}) {
    if (!value->empty() && !common::ParseHostPort(*value, flag).ok()) {
      spdlog::error("controller: {}: '{}' is not HOST:PORT", flag, *value);
      return kExitBadInput;
    }
  }
  if (!grpc_listen_.empty()) config->grpc_listen = grpc_listen_;
  if (!http_listen_.empty()) config->http_listen = http_listen_;
  if (!store_path_.empty()) {
    if (!config->etcd.endpoints.empty()) {
      spdlog::error(
          "controller: --store: the config's store is etcd (store.etcd); a SQLite "
          "file would be a second brain");
      return kExitBadInput;
    }
    config->store_path = store_path_;
  }
  if (!config->etcd.endpoints.empty() && config->etcd.advertise.empty()) {
    // The leader key says where the leader is: standbys send writes there.
    auto hp = common::ParseHostPort(config->http_listen, "listen.http");
    if (hp.ok() && (hp->host == "0.0.0.0" || hp->host == "::")) {
      spdlog::error(
          "controller: store.advertise: listen.http '{}' is a wildcard, so the leader key "
          "cannot say where this controller is; set store.advertise to its HOST:PORT",
          config->http_listen);
      return kExitBadInput;
    }
  }
  // The flags may move a port off loopback: the file's safety rules again.
  if (std::optional<controller::ExposureProblem> p = controller::CheckExposure(*config)) {
    spdlog::error("controller: {} (with the flags): {}", p->field, p->message);
    return kExitBadInput;
  }
  if (check_) {
    std::printf(
        "controller config ok: %zu listed node(s)%s, redundancy %lld, grpc %s, http %s, "
        "%zu token(s)\n",
        config->nodes.size(), config->registration.enabled ? " + registration" : "",
        static_cast<long long>(config->redundancy), config->grpc_listen.c_str(),
        config->http_listen.c_str(), config->tokens.size());
    return kExitOk;
  }
  if (!config->etcd.endpoints.empty()) return RunOnEtcd(*config, stop_signals);
  std::unique_ptr<controller::Store> store;
  if (config->store_path.empty()) {
    spdlog::warn("controller: no store.path: state lives in memory and dies with the process");
    store = std::make_unique<controller::MemoryStore>();
  } else {
    auto sqlite = controller::SqliteStore::Open(config->store_path, {.init = init_});
    if (!sqlite.ok()) {
      spdlog::error("controller: {}", sqlite.status().message());
      return kExitFailure;
    }
    store = std::move(*sqlite);
  }
  bool signalled = false;
  return Serve(*config, std::move(store), nullptr, stop_signals, &signalled);
}

int ControllerCommand::RunOnEtcd(const controller::ControllerConfig& config,
                                 StopSignals& stop_signals) {
  const auto& etcd = config.etcd;
  auto client = etcd::EtcdClient::Connect({.endpoints = etcd.endpoints,
                                           .tls_ca = etcd.tls_ca,
                                           .tls_cert = etcd.tls_cert,
                                           .tls_key = etcd.tls_key,
                                           .require_answer = false});
  if (!client.ok()) {  // an endpoint's URL, or the TLS files
    spdlog::error("controller: {}", client.status().message());
    return kExitBadInput;
  }
  // etcd down at start is not fatal: the controller stands by (its API says
  // it cannot read etcd) and campaigns until etcd answers.
  if (auto status = (*client)->Status(); !status.ok()) {
    spdlog::error("controller: {}; standing by, and trying again until it answers",
                  status.status().message());
  }
  while (true) {
    std::unique_ptr<controller::EtcdLeader> leader;
    auto store = LeadOnEtcd(config, *client, stop_signals, &leader);
    if (!store.ok()) {
      if (absl::IsCancelled(store.status())) return kExitOk;  // stopped while standing by
      spdlog::error("controller: {}", store.status().message());
      return kExitFailure;
    }
    bool signalled = false;
    const int code = Serve(config, std::move(*store), leader.get(), stop_signals, &signalled);
    // A stop signal ends the process even if the leadership went at the same
    // time (or a write raced the planned stop's revoke and found the fence
    // gone); otherwise only a lost leadership goes on.
    if (signalled || !leadership_lost_) return code;
    // Lost the lease (etcd without quorum, or unreachable from here): this
    // process stopped acting at once; it stands by again, says so in its
    // API and metrics, and leads again when etcd lets it.
    spdlog::warn("controller: standing by again after losing leadership");
    leader.reset();  // its keep-alive thread ends first: no late word from this term
    std::lock_guard<std::mutex> lock(lost_mu_);
    leadership_lost_ = false;
    lost_why_.clear();
  }
}

int ControllerCommand::Serve(const controller::ControllerConfig& config,
                             std::unique_ptr<controller::Store> store,
                             controller::EtcdLeader* leader, StopSignals& stop_signals,
                             bool* signalled) {
  controller::ShellFenceRunner fencer;
  controller::Controller c(config, std::move(store), common::RealClock::Get(), &fencer);
  // Acts only while the lease holds, even if the keep-alive thread is late.
  if (leader) c.SetLeaseCheck([leader] { return leader->Holds(); });
  SetActing(&c);
  absl::Cleanup forget = [this] { SetActing(nullptr); };
  if (absl::Status s = c.Recover(); !s.ok()) {
    spdlog::error("controller: recovering from the store: {}", s.message());
    if (leader != nullptr && !absl::IsDataLoss(s)) {
      // etcd slow or gone just as this one won: hand the lease back and
      // stand by again, rather than leave the key to a dead lease's TTL.
      leader->Resign();
      LoseLeadership(absl::StrCat("recovery failed: ", s.message()));
    }
    return kExitFailure;
  }
  controller::ControllerServer server(&c, config);
  if (absl::Status s = server.Start(); !s.ok()) {
    spdlog::error("controller: {}", s.message());
    return kExitFailure;
  }
  std::string host = config.http_listen.substr(0, config.http_listen.rfind(':'));
  std::printf("gpuha controller grpc %s:%d http %s:%u\n", host.c_str(), server.grpc_port(),
              host.c_str(), server.http_port());
  std::fflush(stdout);
  common::SdNotifyOrLog(absl::StrCat("READY=1\nSTATUS=controller grpc ", host, ":",
                                     server.grpc_port(), " http ", host, ":", server.http_port()));
  // A stop signal, or the leadership lost (LoseLeadership has already
  // stopped every act; this thread only winds the servers down).
  int signo = 0;
  while (signo == 0 && !leadership_lost_) signo = stop_signals.WaitFor(50);
  *signalled = signo != 0;
  if (signo != 0) {
    spdlog::info("controller: signal {}, stopping", signo);
    common::SdNotifyOrLog("STOPPING=1");
  }
  if (leader && !leadership_lost_) {
    // A planned stop hands over first: this one stops acting, then the lease
    // goes and a standby (waiting on the key) leads at once, while this
    // process still closes its streams. Agents and routers move on to it.
    c.StopActing("stopping: handed over to the next controller");
    leader->Resign();
  }
  server.Stop();
  return signo != 0 || !leadership_lost_ ? kExitOk : kExitFailure;
}

absl::StatusOr<std::unique_ptr<controller::Store>> ControllerCommand::LeadOnEtcd(
    const controller::ControllerConfig& config, std::shared_ptr<etcd::EtcdClient> client,
    StopSignals& stop_signals, std::unique_ptr<controller::EtcdLeader>* leader) {
  const auto& etcd = config.etcd;
  const std::string identity = etcd.advertise.empty() ? config.http_listen : etcd.advertise;
  *leader = std::make_unique<controller::EtcdLeader>(client, controller::LeaderKey(etcd.prefix),
                                                     identity, etcd.lease_ttl);
  spdlog::info("controller: on etcd {} as {}; campaigning to lead",
               absl::StrJoin(etcd.endpoints, ","), identity);
  common::SdNotifyOrLog("STATUS=standing by: campaigning to lead on etcd");
  // While another leads, this one serves the read API from etcd.
  controller::ShellFenceRunner no_fences;  // a standby fences nothing
  controller::Standby standby(config, client, &no_fences);
  if (absl::Status s = standby.Start(); !s.ok()) return s;
  // Campaign on a thread; this one still answers a stop signal.
  std::atomic<bool> stopping{false};
  auto campaign = std::async(std::launch::async, [&] { return (*leader)->Campaign(&stopping); });
  while (campaign.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    if (int signo = stop_signals.WaitFor(20); signo != 0) {
      spdlog::info("controller: signal {} while standing by, stopping", signo);
      stopping = true;
    }
  }
  absl::StatusOr<int64_t> token = campaign.get();
  if (!token.ok()) return token.status();
  if (stopping) {  // the signal came as it won: hand over at once
    (*leader)->Resign();
    return absl::CancelledError("stopped as it began to lead");
  }
  spdlog::info("controller: leading (fencing token {})", *token);
  // Renewing starts now, before the standby winds down (its thread may be
  // in a slow read) and before recovery reads the store: neither may let
  // the lease lapse while this process thinks it leads.
  (*leader)->KeepAlive([this](const std::string& why) { LoseLeadership(why); });
  standby.Stop();  // listen.http is the leader's from here
  auto store = std::make_unique<controller::EtcdStore>(client, etcd.prefix,
                                                       static_cast<size_t>(etcd.max_txn_ops));
  store->SetFence((*leader)->key(), *token);
  store->OnFenceLost([this] { LoseLeadership("a write found another controller leading"); });
  return store;
}

void ControllerCommand::LoseLeadership(const std::string& why) {
  // Losing the lease (etcd without quorum or out of reach, or this process
  // paused past the TTL) stops every act at once: another controller may
  // lead already, and the store refuses this one's writes. The main thread
  // then winds the servers down and stands by again (RunOnEtcd).
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (leadership_lost_.exchange(true)) return;
    lost_why_ = why;
    if (acting_ != nullptr) acting_->StopActing(why);
  }
  spdlog::error("controller: leadership lost: {}; it acts no more, and stands by again", why);
}

void ControllerCommand::SetActing(controller::Controller* c) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  acting_ = c;
  // Lost before the controller was built: it starts deposed.
  if (c != nullptr && leadership_lost_) c->StopActing(lost_why_);
}

}  // namespace gpuha::cli
