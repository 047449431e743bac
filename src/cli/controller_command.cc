#include "cli/controller_command.h"

#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/exit_codes.h"
#include "cli/signals.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/names.h"
#include "common/net_util.h"
#include "common/sd_notify.h"
#include "controller/controller.h"
#include "controller/service.h"

namespace gpuha::cli {

using nlohmann::json;

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
  if (!store_path_.empty()) config->store_path = store_path_;
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

  controller::ShellFenceRunner fencer;
  controller::Controller c(*config, std::move(store), common::RealClock::Get(), &fencer);
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
  server.Stop();
  return kExitOk;
}

CtlCommand::CtlCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("ctl", "Operator CLI against the controller API");
  app_->add_option("--controller", controller_, "Controller API URL")->envname("GPUHA_CONTROLLER");
  app_->add_option("--token", token_, "Bearer token (or $GPUHA_TOKEN)")->envname("GPUHA_TOKEN");
  app_->add_flag("--json", json_, "Print the API's JSON instead of a table");
  app_->add_flag("--force", force_, "drain: even when it breaks N+k");
  app_->add_option("--tenant", tenant_, "add-stream: the stream's tenant");
  app_->add_option("--weight", weight_, "add-stream: stream units")->check(CLI::Range(1, 1000000));
  app_->add_option(
          "command", command_,
          "status | nodes | streams | events | failovers | capacity | tenants | drain NODE | "
          "undrain NODE | fail NODE | set-role NODE ROLE | add-stream ID | "
          "remove-stream ID | hash-token TOKEN")
      ->required()
      ->check(CLI::IsMember({"status", "nodes", "streams", "events", "failovers", "capacity",
                             "tenants", "drain", "undrain", "fail", "set-role", "add-stream",
                             "remove-stream", "hash-token"}));
  app_->add_option("args", args_, "Arguments of the command");
}

namespace {

std::string Cell(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_null()) return "-";
  return v.dump();
}

void Table(const json& rows, const std::vector<std::string>& columns) {
  std::vector<size_t> width;
  for (const std::string& c : columns) width.push_back(c.size());
  for (const json& r : rows) {
    for (size_t i = 0; i < columns.size(); ++i) {
      width[i] = std::max(width[i], Cell(r.value(columns[i], json())).size());
    }
  }
  auto line = [&](auto cell) {
    std::string out;
    for (size_t i = 0; i < columns.size(); ++i) {
      out += absl::StrFormat("%-*s  ", static_cast<int>(width[i]), cell(i));
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    std::cout << out << "\n";
  };
  line([&](size_t i) { return absl::AsciiStrToUpper(columns[i]); });
  for (const json& r : rows) line([&](size_t i) { return Cell(r.value(columns[i], json())); });
}

}  // namespace

int CtlCommand::Run() {
  if (command_ == "hash-token") {
    if (args_.size() != 1) {
      std::cerr << "gpuha ctl hash-token TOKEN\n";
      return kExitBadInput;
    }
    std::cout << controller::Sha256Hex(args_[0]) << "\n";
    return kExitOk;
  }
  auto url = common::ParseHttpUrl(controller_);
  if (!url.ok()) {
    std::cerr << "gpuha ctl: --controller: " << url.status().message() << "\n";
    return kExitBadInput;
  }
  size_t needs = command_ == "set-role" ? 2
                 : (command_ == "drain" || command_ == "undrain" || command_ == "fail" ||
                    command_ == "add-stream" || command_ == "remove-stream")
                     ? 1
                     : 0;
  if (args_.size() != needs) {
    std::cerr << "gpuha ctl " << command_ << ": expects " << needs << " argument(s), got "
              << args_.size() << "\n";
    return kExitBadInput;
  }
  // Every value that goes into the request line or a header is checked
  // first: a token or name holding CR LF would write a header of its own.
  for (size_t i = 0; i < token_.size(); ++i) {
    auto c = static_cast<unsigned char>(token_[i]);
    if (c < 0x20 || c == 0x7f) {
      std::cerr << absl::StrFormat("gpuha ctl: --token: control character 0x%02x at byte %d\n", c,
                                   i);
      return kExitBadInput;
    }
  }
  const bool names_stream = command_ == "add-stream" || command_ == "remove-stream";
  if (!args_.empty() && !names_stream && !common::ValidName(args_[0])) {
    std::cerr << "gpuha ctl " << command_ << ": '" << absl::CHexEscape(args_[0])
              << "' is not a node name (" << common::kNameRule << ")\n";
    return kExitBadInput;
  }
  if (names_stream && !common::ValidStreamId(args_[0])) {
    std::cerr << "gpuha ctl " << command_ << ": '" << absl::CHexEscape(args_[0])
              << "' is not a stream ID (" << common::kStreamIdRule << ")\n";
    return kExitBadInput;
  }
  std::string method = "GET", path, body;
  if (command_ == "status" || command_ == "nodes") path = "/api/v1/nodes";
  if (command_ == "streams") path = "/api/v1/streams";
  if (command_ == "events") path = "/api/v1/events";
  if (command_ == "failovers") path = "/api/v1/failovers";
  if (command_ == "capacity") path = "/api/v1/capacity";
  if (command_ == "tenants") path = "/api/v1/tenants";
  if (command_ == "drain" || command_ == "undrain" || command_ == "fail") {
    method = "POST";
    path = absl::StrCat("/api/v1/nodes/", args_[0], "/", command_,
                        command_ == "drain" && force_ ? "?force=true" : "");
  }
  if (command_ == "set-role") {
    method = "POST";
    path = absl::StrCat("/api/v1/nodes/", args_[0], "/role");
    body = json{{"role", args_[1]}}.dump();
  }
  if (command_ == "add-stream") {
    if (tenant_.empty()) {
      std::cerr << "gpuha ctl add-stream: --tenant is required\n";
      return kExitBadInput;
    }
    if (!common::ValidName(tenant_)) {
      std::cerr << "gpuha ctl add-stream: --tenant: '" << absl::CHexEscape(tenant_)
                << "' is not a tenant name (" << common::kNameRule << ")\n";
      return kExitBadInput;
    }
    method = "POST";
    path = "/api/v1/streams";
    body = json{{"id", args_[0]}, {"tenant", tenant_}, {"weight", weight_}}.dump();
  }
  if (command_ == "remove-stream") {
    method = "DELETE";
    path = "/api/v1/streams/" + args_[0];
  }
  auto r =
      common::HttpCall(method, url->host, url->port, path, body, std::chrono::seconds(10), token_);
  if (!r.ok()) {
    std::cerr << "gpuha ctl: controller " << controller_ << " unreachable: " << r.status().message()
              << "\n";
    return kExitFailure;
  }
  json j = json::parse(r->body, nullptr, false);
  if (r->status >= 400) {
    std::cerr << "gpuha ctl: " << r->status << ": "
              << (j.is_object() && j.contains("error") && j["error"].is_string()
                      ? j["error"].get<std::string>()
                      : r->body)
              << "\n";
    return r->status == 400 || r->status == 404 || r->status == 409 ? kExitBadInput : kExitFailure;
  }
  if (json_ || j.is_discarded()) {
    std::cout << r->body;
    return kExitOk;
  }
  // A controller of another version may answer another shape: say so
  // instead of aborting on a JSON type error.
  try {
    Print(j);
  } catch (const json::exception& e) {
    std::cerr << "gpuha ctl: " << controller_ << " answered " << path
              << " in a shape this ctl does not read (" << e.what() << "); --json prints it\n";
    return kExitFailure;
  }
  return kExitOk;
}

void CtlCommand::Print(const json& j) const {
  if (command_ == "status" || command_ == "nodes") {
    Table(j, {"name", "role", "state", "health", "load", "capacity", "connected", "fenced"});
  } else if (command_ == "streams") {
    Table(j, {"id", "tenant", "weight", "primary", "standby", "placed"});
  } else if (command_ == "events") {
    Table(j, {"id", "mono_ms", "type", "node", "detail"});
  } else if (command_ == "tenants") {
    Table(j, {"name", "streams", "units"});
  } else if (command_ == "failovers") {
    Table(j, {"node", "epoch", "fault_to_detected_ms", "detected_to_fenced_ms",
              "detected_to_routes_pushed_ms", "detected_to_routers_acked_ms", "reason"});
  } else if (command_ == "capacity") {
    // The same figures, in the same words, as `gpuha plan`, from the live cluster.
    int64_t k = j.value("redundancy", 0);
    std::cout << absl::StrFormat("Capacity (N+%d, live)\n", k);
    auto row = [](const std::string& label, const std::string& value) {
      std::cout << absl::StrFormat("  %-30s %s\n", label, value);
    };
    row("total capacity", absl::StrCat(Cell(j["total_units"]), " units"));
    row(absl::StrCat("failover reserve (k=", k, ")"),
        absl::StrCat(Cell(j["failover_reserve_units"]), " units"));
    row("max production load", absl::StrCat(Cell(j["max_production_units"]), " units"));
    row("admitted load", absl::StrCat(Cell(j["admitted_units"]), " units"));
    row("headroom", absl::StrCat(Cell(j["headroom_units"]), " units"));
    row(absl::StrCat("survives loss of ", k, " node(s)"),
        j.value("survives_node_loss", false) ? "yes" : "NO");
    row("degraded (CPU buffer)", absl::StrCat(Cell(j["degraded_units"]), " units"));
    row("unplaced streams", Cell(j["unplaced_streams"]));
  } else {
    std::cout << j.dump(2) << "\n";
  }
}

}  // namespace gpuha::cli
