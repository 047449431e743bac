#include "cli/controller_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <iostream>

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
#include "controller/etcd.h"
#include "controller/service.h"

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
  std::unique_ptr<controller::Store> store;
  std::unique_ptr<controller::EtcdLeader> leader;
  if (!config->etcd.endpoints.empty()) {
    auto etcd = LeadOnEtcd(*config, stop_signals, &leader);
    if (!etcd.ok()) {
      if (absl::IsCancelled(etcd.status())) return kExitOk;  // stopped while standing by
      spdlog::error("controller: {}", etcd.status().message());
      return kExitFailure;
    }
    store = std::move(*etcd);
  } else if (config->store_path.empty()) {
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

  controller::ShellFenceRunner fencer;
  controller::Controller c(*config, std::move(store), common::RealClock::Get(), &fencer);
  SetActing(&c);
  absl::Cleanup forget = [this] { SetActing(nullptr); };
  if (absl::Status s = c.Recover(); !s.ok()) {
    spdlog::error("controller: recovering from the store: {}", s.message());
    return kExitFailure;
  }
  controller::ControllerServer server(&c, *config);
  if (absl::Status s = server.Start(); !s.ok()) {
    spdlog::error("controller: {}", s.message());
    return kExitFailure;
  }
  std::string host = config->http_listen.substr(0, config->http_listen.rfind(':'));
  std::printf("gpuha controller grpc %s:%d http %s:%u\n", host.c_str(), server.grpc_port(),
              host.c_str(), server.http_port());
  std::fflush(stdout);
  common::SdNotifyOrLog(absl::StrCat("READY=1\nSTATUS=controller grpc ", host, ":",
                                     server.grpc_port(), " http ", host, ":", server.http_port()));
  int signo = stop_signals.Wait();
  spdlog::info("controller: signal {}, stopping", signo);
  common::SdNotifyOrLog("STOPPING=1");
  if (leader && !leadership_lost_) {
    // A planned stop hands over first: this one stops acting, then the lease
    // goes and a standby (waiting on the key) leads at once, while this
    // process still closes its streams. Agents and routers move on to it.
    c.StopActing("stopping: handed over to the next controller");
    leader->Resign();
  }
  server.Stop();
  return leadership_lost_ ? kExitFailure : kExitOk;
}

absl::StatusOr<std::unique_ptr<controller::Store>> ControllerCommand::LeadOnEtcd(
    const controller::ControllerConfig& config, StopSignals& stop_signals,
    std::unique_ptr<controller::EtcdLeader>* leader) {
  const auto& etcd = config.etcd;
  auto client = controller::EtcdClient::Connect({.endpoints = etcd.endpoints,
                                                 .tls_ca = etcd.tls_ca,
                                                 .tls_cert = etcd.tls_cert,
                                                 .tls_key = etcd.tls_key});
  if (!client.ok()) return client.status();
  const std::string identity = etcd.advertise.empty() ? config.http_listen : etcd.advertise;
  *leader = std::make_unique<controller::EtcdLeader>(*client, etcd.prefix + "leader", identity,
                                                     etcd.lease_ttl);
  spdlog::info("controller: on etcd {} as {}; campaigning to lead",
               absl::StrJoin(etcd.endpoints, ","), identity);
  common::SdNotifyOrLog("STATUS=standing by: campaigning to lead on etcd");
  // Campaign on a thread; this one still answers a stop signal.
  std::atomic<bool> stopping{false};
  auto campaign = std::async(std::launch::async, [&] { return (*leader)->Campaign(&stopping); });
  while (campaign.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    if (int signo = stop_signals.WaitFor(100); signo != 0) {
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
  // Renewing starts now, before recovery reads the store: a slow recovery
  // must not let the lease lapse while this process thinks it leads.
  (*leader)->KeepAlive([this](const std::string& why) { LoseLeadership(why); });
  auto store = std::make_unique<controller::EtcdStore>(*client, etcd.prefix,
                                                       static_cast<size_t>(etcd.max_txn_ops));
  store->SetFence((*leader)->key(), *token);
  store->OnFenceLost([this] { LoseLeadership("a write found another controller leading"); });
  return store;
}

void ControllerCommand::LoseLeadership(const std::string& why) {
  // Losing the lease (etcd without quorum, or this process paused past the
  // TTL) ends this process, as kube-controller-manager does: another
  // controller may lead already, and the store refuses this one's writes.
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (leadership_lost_.exchange(true)) return;
    lost_why_ = why;
    if (acting_ != nullptr) acting_->StopActing(why);
  }
  spdlog::error("controller: leadership lost: {}; stopping so that only the leader acts", why);
  ::kill(::getpid(), SIGTERM);
}

void ControllerCommand::SetActing(controller::Controller* c) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  acting_ = c;
  // Lost before the controller was built: it starts deposed.
  if (c != nullptr && leadership_lost_) c->StopActing(lost_why_);
}

}  // namespace gpuha::cli
