#include "cli/ctl_command.h"

#include <chrono>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "api/units.h"
#include "cli/ctl_format.h"
#include "cli/exit_codes.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "common/names.h"
#include "common/net_util.h"

namespace gpuha::cli {

using nlohmann::json;

namespace {

// The wall clock the rest of gpuha reads (common::RealClock), in ms.
double NowUnixMs() { return static_cast<double>(common::RealClock::Get()->UnixNanos()) / 1e6; }

const std::vector<Column>& NodeColumns(bool wide) {
  static const std::vector<Column> kTable = {
      {"name", "name"}, {"role", "role"},         {"state", "state"},        {"health", "health"},
      {"load", "load"}, {"capacity", "capacity"}, {"connected", "connected"}};
  static const std::vector<Column> kWide = [] {
    std::vector<Column> c = kTable;
    c.insert(c.end(), {{"fenced", "fenced"},
                       {"server-ready", "server_ready"},
                       {"address", "address"},
                       {"reasons", "reasons", CellKind::kList}});
    return c;
  }();
  return wide ? kWide : kTable;
}

const std::vector<Column>& EventColumns(bool wide) {
  static const std::vector<Column> kTable = {{"time", "unix_ms", CellKind::kTime},
                                             {"type", "type"},
                                             {"node", "node"},
                                             {"detail", "detail"}};
  static const std::vector<Column> kWide = {{"id", "id"},
                                            {"time", "unix_ms", CellKind::kTime},
                                            {"age", "unix_ms", CellKind::kAge},
                                            {"epoch", "epoch"},
                                            {"type", "type"},
                                            {"node", "node"},
                                            {"detail", "detail"}};
  return wide ? kWide : kTable;
}

const std::vector<Column>& FailoverColumns() {
  static const std::vector<Column> kColumns = {
      {"time", "detected_unix_ms", CellKind::kTime},
      {"node", "node"},
      {"epoch", "epoch"},
      {"fault-to-detected", "fault_to_detected_ms", CellKind::kDuration},
      {"seen-by", "fault_seen_by"},
      {"to-fenced", "detected_to_fenced_ms", CellKind::kDuration},
      {"to-routes", "detected_to_routes_pushed_ms", CellKind::kDuration},
      {"to-acked", "detected_to_routers_acked_ms", CellKind::kDuration},
      {"reason", "reason"}};
  return kColumns;
}

const std::vector<Column> kStreamColumns = {{"id", "id"},           {"tenant", "tenant"},
                                            {"weight", "weight"},   {"primary", "primary"},
                                            {"standby", "standby"}, {"placed", "placed"}};
const std::vector<Column> kJobColumns = {{"id", "id"},
                                         {"phase", "phase"},
                                         {"node", "node"},
                                         {"epoch", "job_epoch"},
                                         {"step", "step"},
                                         {"checkpoint", "checkpoint_step"},
                                         {"takeovers", "takeovers"},
                                         {"why", "why"}};

// Verbs with their help; `arg` names the positional argument, if any.
struct Verb {
  const char* name;
  const char* help;
  const char* arg;
  const char* examples;
};
const Verb kVerbs[] = {
    {"status",
     "The cluster at a glance: control plane, nodes by state, N+k headroom, recent failovers",
     nullptr, "  gpuha ctl status\n  gpuha ctl status -o json"},
    {"nodes", "List nodes with role, lifecycle state, health and load", nullptr,
     "  gpuha ctl nodes\n  gpuha ctl nodes -o wide    # fenced, server ready, address, reasons"},
    {"streams", "List streams with tenant, primary and standby", nullptr,
     "  gpuha ctl streams -o yaml"},
    {"events", "The controller's events, oldest first (newest 1000)", nullptr,
     "  gpuha ctl events --since 10m\n  gpuha ctl events --since 2026-12-02T15:00:00Z -o wide\n"
     "  gpuha ctl events --watch             # follow new events until Ctrl-C"},
    {"failovers", "Each failover with its step timings", nullptr, "  gpuha ctl failovers"},
    {"capacity", "N+k capacity of the live cluster, in the words of `gpuha plan`", nullptr,
     "  gpuha ctl capacity"},
    {"tenants", "Tenants with their streams and units", nullptr, "  gpuha ctl tenants"},
    {"drain", "Move a node's work away and keep it out of placement (refused if it breaks N+k)",
     "NODE", "  gpuha ctl drain gpu-3\n  gpuha ctl drain gpu-3 --force   # even below N+k"},
    {"undrain", "Let a drained or held-out node take work again", "NODE",
     "  gpuha ctl undrain gpu-3"},
    {"fail", "Fail a node over now, as if its agent reported failed", "NODE",
     "  gpuha ctl fail gpu-3"},
    {"set-role", "Change a node's role (admin token)", "NODE", "  gpuha ctl set-role gpu-5 buffer"},
    {"rebind",
     "Free a registered node from the IP its agent registered from, so an agent on another "
     "host can register it (admin token)",
     "NODE", "  gpuha ctl rebind gpu-5"},
    {"remove-node",
     "Forget a registered node that left: its agent stopped, the node drained or failed, no "
     "stream or job on it (admin token)",
     "NODE", "  gpuha ctl remove-node gpu-5"},
    {"add-stream", "Admit a stream (refused when N+k would break)", "ID",
     "  gpuha ctl add-stream cam-17 --tenant acme --weight 2"},
    {"remove-stream", "Remove a stream and its routes", "ID", "  gpuha ctl remove-stream cam-17"},
    {"jobs", "List stateful jobs (training) with phase, node, step and last checkpoint", nullptr,
     "  gpuha ctl jobs\n  gpuha ctl jobs -o json    # with each job's last takeover timeline"},
    {"add-job",
     "Start a stateful job that restarts from its last checkpoint on another node after a "
     "failure, once the old node is fenced",
     "ID",
     "  gpuha ctl add-job train-1 --gpus 1 --checkpoint-dir /mnt/san/train-1 -- \\\n"
     "      gpuha worker --train --checkpoint-dir {checkpoint_dir} --epoch {epoch} \\\n"
     "      --checkpoint-every {checkpoint_every} --progress-file {progress_file}\n"
     "  ({job}, {epoch}, {checkpoint_dir}, {checkpoint_every}: filled in by the controller;\n"
     "   {progress_file}: by the agent)"},
    {"remove-job", "Stop a job (it checkpoints) and forget it", "ID",
     "  gpuha ctl remove-job train-1"},
    {"confirm-fenced",
     "Say that a blocked job's old node is off, so the job restarts elsewhere (Pacemaker's "
     "stonith_admin --confirm); only once it really is off",
     "JOB", "  gpuha ctl confirm-fenced train-1"},
    {"hash-token", "Print the SHA-256 of a token, as configs store it (no controller needed)",
     "TOKEN", "  gpuha ctl hash-token \"$(openssl rand -hex 16)\""},
};

}  // namespace

CtlCommand::CtlCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("ctl", "Operator CLI against the controller API");
  app_->require_subcommand(1);
  app_->footer(
      "Examples:\n  gpuha ctl status\n  gpuha ctl nodes -o wide\n"
      "  gpuha ctl events --since 10m --watch\n  gpuha ctl describe node gpu-3\n"
      "  gpuha ctl drain gpu-3\n\nEach command has --help with examples.");
  app_->add_option("--controller", controller_, "Controller API URL")
      ->envname("GPUHA_CONTROLLER")
      ->capture_default_str();
  app_->add_option("--token", token_, "Bearer token (or $GPUHA_TOKEN)")->envname("GPUHA_TOKEN");
  app_->add_option("-o,--output", output_, "Output format")
      ->check(CLI::IsMember({"table", "wide", "json", "yaml"}))
      ->capture_default_str();
  app_->add_flag("--json", json_, "The same as -o json");
  for (const Verb& v : kVerbs) {
    CLI::App* sub = app_->add_subcommand(v.name, v.help);
    sub->fallthrough();  // --controller, --token, -o may follow the verb
    sub->footer(absl::StrCat("Examples:\n", v.examples));
    if (v.arg != nullptr) sub->add_option(v.arg, name_, "")->required();
    std::string verb = v.name;
    if (verb == "events") {
      sub->add_option("--since", since_,
                      "Only events from this far back (10m, 1h30m) or since an RFC 3339 time");
      sub->add_flag("-w,--watch", watch_, "Keep printing new events until interrupted");
      sub->add_option("--interval", interval_s_, "--watch: seconds between polls")
          ->check(CLI::Range(0.1, 60.0))
          ->capture_default_str();
    }
    if (verb == "drain") sub->add_flag("--force", force_, "Even when it breaks N+k");
    if (verb == "set-role") {
      sub->add_option("ROLE", role_, "")
          ->required()
          ->check(CLI::IsMember({"active", "passive", "buffer"}));
    }
    if (verb == "add-job") {
      sub->add_option("COMMAND", job_command_, "The job's program and arguments, after --")
          ->required();
      sub->add_option("--gpus", gpus_, "GPUs the job needs on one node")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
      sub->add_option("--checkpoint-dir", checkpoint_dir_,
                      "Absolute path of its checkpoints, on storage every node mounts")
          ->required();
      sub->add_option("--checkpoint-every", checkpoint_every_, "Steps between checkpoints")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
          ->capture_default_str();
    }
    if (verb == "add-stream") {
      sub->add_option("--tenant", tenant_, "The stream's tenant")->required();
      sub->add_option("--weight", weight_, "Stream units")
          ->check(CLI::Range(1, 1000000))
          ->capture_default_str();
    }
  }
  describe_ = app_->add_subcommand("describe", "One node or stream in full, with its events");
  describe_->require_subcommand(1);
  describe_->fallthrough();
  describe_->footer(
      "Examples:\n  gpuha ctl describe node gpu-3\n  gpuha ctl describe stream cam-17 -o json");
  CLI::App* node = describe_->add_subcommand(
      "node", "A node: lifecycle, health reasons, GPUs, its streams, its recent events");
  node->add_option("NODE", name_, "")->required();
  node->fallthrough();
  CLI::App* stream = describe_->add_subcommand(
      "stream", "A stream: tenant, weight, and the state of its primary and standby");
  stream->add_option("ID", name_, "")->required();
  stream->fallthrough();
}

CtlCommand::Answer CtlCommand::Call(const std::string& method, const std::string& path,
                                    const std::string& body) const {
  auto url = common::ParseHttpUrl(controller_);
  if (!url.ok()) {
    std::cerr << "gpuha ctl: --controller: " << url.status().message() << "\n";
    return {kExitBadInput, {}};
  }
  auto r =
      common::HttpCall(method, url->host, url->port, path, body, std::chrono::seconds(10), token_);
  if (!r.ok()) {
    std::cerr << "gpuha ctl: controller " << controller_ << " unreachable: " << r.status().message()
              << "\n";
    return {kExitFailure, {}};
  }
  json j = json::parse(r->body, nullptr, false);
  if (r->status == 307 && j.is_object() && j.contains("leader") && j["leader"].is_string()) {
    // A standby controller sends writes to the leader: follow it, once.
    const std::string leader = j["leader"];
    auto to = common::ParseHostPort(leader, "leader");
    if (!to.ok()) {
      std::cerr << "gpuha ctl: " << controller_ << " stands by and names a leader '" << leader
                << "' that is not HOST:PORT\n";
      return {kExitFailure, {}};
    }
    std::cerr << "gpuha ctl: " << controller_ << " stands by; sending to the leader at " << leader
              << "\n";
    r = common::HttpCall(method, to->host, to->port, path, body, std::chrono::seconds(10), token_);
    if (!r.ok()) {
      std::cerr << "gpuha ctl: the leader " << leader << " unreachable: " << r.status().message()
                << "\n";
      return {kExitFailure, {}};
    }
    j = json::parse(r->body, nullptr, false);
    if (r->status / 100 == 3) {  // leadership moved again meanwhile: nothing was done
      std::cerr << "gpuha ctl: " << leader
                << " no longer leads either (leadership is moving); try again\n";
      return {kExitFailure, {}};
    }
  }
  if (r->status >= 400) {
    std::cerr << "gpuha ctl: " << r->status << ": "
              << (j.is_object() && j.contains("error") && j["error"].is_string()
                      ? j["error"].get<std::string>()
                      : r->body)
              << "\n";
    return {r->status == 400 || r->status == 404 || r->status == 409 ? kExitBadInput : kExitFailure,
            {}};
  }
  if (j.is_discarded()) {
    std::cerr << "gpuha ctl: " << controller_ << path << " did not answer JSON\n";
    return {kExitFailure, {}};
  }
  return {kExitOk, std::move(j)};
}

int CtlCommand::Print(const json& j, const std::function<void(const json&)>& table) const {
  if (output_ == "json") {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  if (output_ == "yaml") {
    std::cout << RenderYaml(j);
    return kExitOk;
  }
  // A controller of another version may answer another shape: say so
  // instead of aborting on a JSON type error.
  try {
    table(j);
  } catch (const json::exception& e) {
    std::cerr << "gpuha ctl: " << controller_ << " answered in a shape this ctl does not read ("
              << e.what() << "); -o json prints it\n";
    return kExitFailure;
  }
  return kExitOk;
}

int CtlCommand::Run() {
  // An answer of a shape this ctl does not read (another version's
  // controller) is an error message, not an abort.
  try {
    return RunVerb();
  } catch (const json::exception& e) {
    std::cerr << "gpuha ctl: " << controller_ << " answered in a shape this ctl does not read ("
              << e.what() << "); -o json prints it\n";
    return kExitFailure;
  }
}

int CtlCommand::RunVerb() {
  if (json_) output_ = "json";
  const CLI::App* verb = app_->get_subcommands().front();
  const std::string command = verb->get_name();
  if (command == "hash-token") {
    const std::string hash = common::Sha256Hex(name_);
    return Print(json{{"sha256", hash}}, [&](const json&) { std::cout << hash << "\n"; });
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
  if (auto url = common::ParseHttpUrl(controller_); !url.ok()) {
    std::cerr << "gpuha ctl: --controller: " << url.status().message() << "\n";
    return kExitBadInput;
  }
  const bool names_stream = command == "add-stream" || command == "remove-stream" ||
                            (command == "describe" && describe_->got_subcommand("stream"));
  if (!name_.empty() && !names_stream && !common::ValidName(name_)) {
    std::cerr << "gpuha ctl " << command << ": '" << absl::CHexEscape(name_) << "' is not a "
              << (absl::StrContains(command, "job") || command == "confirm-fenced" ? "job" : "node")
              << " name (" << common::kNameRule << ")\n";
    return kExitBadInput;
  }
  if (names_stream && !common::ValidStreamId(name_)) {
    std::cerr << "gpuha ctl " << command << ": '" << absl::CHexEscape(name_)
              << "' is not a stream ID (" << common::kStreamIdRule << ")\n";
    return kExitBadInput;
  }
  if (command == "add-stream" && !common::ValidName(tenant_)) {
    std::cerr << "gpuha ctl add-stream: --tenant: '" << absl::CHexEscape(tenant_)
              << "' is not a tenant name (" << common::kNameRule << ")\n";
    return kExitBadInput;
  }
  if (command == "status") return Status();
  if (command == "events") return Events();
  if (command == "describe") {
    return describe_->got_subcommand("node") ? DescribeNode() : DescribeStream();
  }
  if (command == "nodes" || command == "streams" || command == "failovers" ||
      command == "tenants" || command == "capacity" || command == "jobs") {
    Answer a = Call("GET", "/api/v1/" + command);
    if (a.rc != kExitOk) return a.rc;
    double now = NowUnixMs();
    return Print(a.body, [&](const json& j) {
      if (command == "nodes") std::cout << RenderTable(j, NodeColumns(wide()), now);
      if (command == "streams") std::cout << RenderTable(j, kStreamColumns, now);
      if (command == "jobs") std::cout << RenderTable(j, kJobColumns, now);
      if (command == "failovers") std::cout << RenderTable(j, FailoverColumns(), now);
      if (command == "tenants") {
        std::cout << RenderTable(j, {{"name", "name"}, {"streams", "streams"}, {"units", "units"}},
                                 now);
      }
      if (command == "capacity") {
        // The same figures, in the same words, as `gpuha plan`, from the live cluster.
        int64_t k = j.value("redundancy", 0);
        std::cout << absl::StrFormat("Capacity (N+%d, live)\n", k);
        auto row = [&](const std::string& label, const std::string& field,
                       const std::string& unit) {
          std::cout << absl::StrFormat("  %-30s %s%s\n", label,
                                       FormatCell(j.value(field, json()), CellKind::kText, now),
                                       unit);
        };
        row("total capacity", "total_units", " units");
        row(absl::StrCat("failover reserve (k=", k, ")"), "failover_reserve_units", " units");
        row("max production load", "max_production_units", " units");
        row("admitted load", "admitted_units", " units");
        row("headroom", "headroom_units", " units");
        std::cout << absl::StrFormat("  %-30s %s\n",
                                     absl::StrCat("survives loss of ", k, " node(s)"),
                                     j.value("survives_node_loss", false) ? "yes" : "NO");
        row("degraded (CPU buffer)", "degraded_units", " units");
        row("unplaced streams", "unplaced_streams", "");
      }
    });
  }
  return Mutate();
}

int CtlCommand::Mutate() {
  const std::string command = app_->get_subcommands().front()->get_name();
  std::string method = "POST", path, body;
  if (command == "drain" || command == "undrain" || command == "fail" || command == "rebind") {
    path = absl::StrCat("/api/v1/nodes/", name_, "/", command,
                        command == "drain" && force_ ? "?force=true" : "");
  } else if (command == "set-role") {
    path = absl::StrCat("/api/v1/nodes/", name_, "/role");
    body = json{{"role", role_}}.dump();
  } else if (command == "add-stream") {
    path = "/api/v1/streams";
    body = json{{"id", name_}, {"tenant", tenant_}, {"weight", weight_}}.dump();
  } else if (command == "remove-node") {
    method = "DELETE";
    path = "/api/v1/nodes/" + name_;
  } else if (command == "remove-stream") {
    method = "DELETE";
    path = "/api/v1/streams/" + name_;
  } else if (command == "add-job") {
    path = "/api/v1/jobs";
    body = json{{"id", name_},
                {"command", job_command_},
                {"gpus", gpus_},
                {"checkpoint_dir", checkpoint_dir_},
                {"checkpoint_every", checkpoint_every_}}
               .dump();
  } else if (command == "remove-job") {
    method = "DELETE";
    path = "/api/v1/jobs/" + name_;
  } else if (command == "confirm-fenced") {
    path = absl::StrCat("/api/v1/jobs/", name_, "/confirm-fenced");
  } else {
    std::cerr << "gpuha ctl: no command '" << command << "'\n";
    return kExitBadInput;
  }
  Answer a = Call(method, path, body);
  if (a.rc != kExitOk) return a.rc;
  double now = NowUnixMs();
  return Print(a.body, [&](const json& j) {
    if (absl::StartsWith(command, "remove-")) {
      std::cout << "removed " << j.value("removed", name_) << "\n";
    } else if (command == "add-job" || command == "confirm-fenced") {
      std::cout << RenderTable(json::array({j}), kJobColumns, now);
    } else if (command == "add-stream") {
      std::cout << RenderTable(json::array({j}),
                               {{"id", "id"}, {"primary", "primary"}, {"standby", "standby"}}, now);
    } else {
      std::cout << RenderTable(json::array({j}), NodeColumns(wide()), now);
    }
  });
}

int CtlCommand::Events() {
  std::optional<double> since;
  if (!since_.empty()) {
    auto s = ParseSince(since_, NowUnixMs());
    if (!s.ok()) {
      std::cerr << "gpuha ctl events: " << s.status().message() << "\n";
      return kExitBadInput;
    }
    since = *s;
  }
  auto keep = [&](const json& e) {
    return !since || (e.contains("unix_ms") && e["unix_ms"].is_number() &&
                      e["unix_ms"].get<double>() >= *since);
  };
  Answer a = Call("GET", "/api/v1/events");
  if (a.rc != kExitOk) return a.rc;
  if (!a.body.is_array()) {
    std::cerr << "gpuha ctl: " << controller_ << " answered events that are not a list\n";
    return kExitFailure;
  }
  json rows = json::array();
  int64_t last = 0;
  for (const json& e : a.body) {
    last = std::max(last, e.value("id", int64_t{0}));
    if (keep(e)) rows.push_back(e);
  }
  if (!watch_) {
    return Print(rows, [&](const json& j) {
      std::cout << RenderTable(j, EventColumns(wide()), NowUnixMs());
    });
  }
  // --watch: one event per line as it comes (JSON lines for -o json), the
  // table's header once and its columns at fixed widths.
  auto emit = [&](const json& e, bool header) {
    if (output_ == "json") {
      std::cout << e.dump() << "\n";
    } else if (output_ == "yaml") {
      std::cout << "---\n" << RenderYaml(e);
    } else {
      // Fixed widths: later rows cannot widen a column already printed.
      std::string line;
      for (const Column& c : EventColumns(wide())) {
        std::string cell = header ? absl::AsciiStrToUpper(c.header)
                                  : FormatCell(e.value(c.field, json()), c.kind, NowUnixMs());
        size_t width = c.field == "detail"                      ? 0
                       : c.kind == CellKind::kTime              ? 24
                       : c.field == "type" || c.field == "node" ? 16
                                                                : 8;
        line += cell + std::string(cell.size() < width ? width - cell.size() + 1 : 1, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      std::cout << line << "\n";
    }
    std::cout.flush();
  };
  if (output_ != "json" && output_ != "yaml") emit(json::object(), true);
  for (const json& e : rows) emit(e, false);
  for (;;) {
    std::this_thread::sleep_for(std::chrono::duration<double>(interval_s_));
    Answer next = Call("GET", absl::StrCat("/api/v1/events?after=", last));
    if (next.rc != kExitOk) continue;  // the controller restarting: keep watching
    if (!next.body.is_array()) continue;
    for (const json& e : next.body) {
      last = std::max(last, e.value("id", int64_t{0}));
      if (keep(e)) emit(e, false);
    }
  }
}

int CtlCommand::Status() {
  Answer status = Call("GET", "/api/v1/status");
  if (status.rc != kExitOk) return status.rc;
  Answer nodes = Call("GET", "/api/v1/nodes");
  if (nodes.rc != kExitOk) return nodes.rc;
  Answer capacity = Call("GET", "/api/v1/capacity");
  if (capacity.rc != kExitOk) return capacity.rc;
  Answer failovers = Call("GET", "/api/v1/failovers");
  if (failovers.rc != kExitOk) return failovers.rc;
  json recent = json::array();
  if (failovers.body.is_array()) {
    size_t n = failovers.body.size();
    for (size_t i = n > 5 ? n - 5 : 0; i < n; ++i) recent.push_back(failovers.body[i]);
  }
  json all = {{"controller", status.body},
              {"nodes", nodes.body},
              {"capacity", capacity.body},
              {"recent_failovers", recent}};
  double now = NowUnixMs();
  return Print(all, [&](const json& j) {
    const json& s = j["controller"];
    const json& c = j["capacity"];
    // On etcd: which controller answered, and where the leader is (a
    // standby answers reads from etcd and names it).
    const std::string leader = s.contains("leader") && s["leader"].is_string()
                                   ? Printable(s["leader"].get<std::string>())
                                   : "";
    const std::string plane =
        s.value("store", "") == "sqlite"   ? "one controller on SQLite (no quorum to lose)"
        : s.value("store", "") == "memory" ? "one controller, state in memory only"
        : s.value("store", "") != "etcd"   ? "one controller"
        : s.value("role", "") == "standby"
            ? absl::StrCat("controllers on etcd; this one stands by, the leader is ",
                           leader.empty() ? "none (an election is under way)" : leader)
        : s.value("leading", false) ? "controllers on etcd; this one leads"
                                    : "controllers on etcd; this one no longer leads (stopping)";
    std::cout << absl::StrFormat(
        "Control plane: %s; epoch %s, route version %s, %s router(s) following\n", plane,
        FormatCell(s.value("epoch", json()), CellKind::kText, now),
        FormatCell(s.value("route_version", json()), CellKind::kText, now),
        FormatCell(s.value("routers", json()), CellKind::kText, now));
    if (const json up = s.value("store_up", json()); up.is_boolean() && !up.get<bool>()) {
      std::cout << "  store: its last write FAILED (gpuha_controller_store_up 0); nothing is "
                   "persisted until it recovers\n";
    }
    // A standby sends null for what only the leader knows.
    const json grace = s.value("startup_grace_left_ms", json());
    if (grace.is_number() && grace.get<double>() > 0) {
      std::cout << "  startup grace: " << FormatDurationMs(grace.get<double>())
                << " left (no failover until agents reconnect)\n";
    }
    std::map<std::string, std::vector<std::string>> by_state;
    for (const json& n : j["nodes"]) {
      std::string who = Printable(n.value("name", "?"));
      if (n.contains("reasons") && n["reasons"].is_array() && !n["reasons"].empty()) {
        who += " (" + FormatCell(n["reasons"], CellKind::kList, now) + ")";
      }
      by_state[Printable(n.value("state", "?"))].push_back(who);
    }
    std::cout << absl::StrFormat("Nodes: %d\n", j["nodes"].size());
    for (const auto& [state, names] : by_state) {
      std::cout << absl::StrFormat("  %-13s %s\n", state + ":", absl::StrJoin(names, " "));
    }
    int64_t k = c.value("redundancy", 0);
    std::cout << absl::StrFormat(
        "Capacity: N+%d %s; headroom %s units; %s unplaced stream(s)\n", k,
        c.value("survives_node_loss", false) ? "holds" : "BROKEN",
        FormatCell(c.value("headroom_units", json()), CellKind::kText, now),
        FormatCell(c.value("unplaced_streams", json()), CellKind::kText, now));
    std::cout << "Recent failovers:";
    if (j["recent_failovers"].empty()) std::cout << " none";
    std::cout << "\n";
    for (const json& f : j["recent_failovers"]) {
      std::cout << absl::StrFormat(
          "  %s (%s)  %s  epoch %s  detected to acked %s  %s\n",
          FormatCell(f.value("detected_unix_ms", json()), CellKind::kTime, now),
          FormatCell(f.value("detected_unix_ms", json()), CellKind::kAge, now),
          Printable(f.value("node", "?")),
          FormatCell(f.value("epoch", json()), CellKind::kText, now),
          FormatCell(f.value("detected_to_routers_acked_ms", json()), CellKind::kDuration, now),
          Printable(f.value("reason", "")));
    }
  });
}

int CtlCommand::DescribeNode() {
  Answer node = Call("GET", "/api/v1/nodes/" + name_);
  if (node.rc != kExitOk) return node.rc;
  Answer streams = Call("GET", "/api/v1/streams");
  if (streams.rc != kExitOk) return streams.rc;
  Answer events = Call("GET", "/api/v1/events");
  if (events.rc != kExitOk) return events.rc;
  json mine = json::array();
  // On this node: as a whole, or on one of its GPUs ("NODE/gpuI").
  auto on_node = [&](const json& s, const char* as) {
    return api::NodeOfUnit(s.value(as, "")) == name_;
  };
  for (const json& s : streams.body) {
    if (on_node(s, "primary") || on_node(s, "standby")) {
      json row = s;
      row["as"] = on_node(s, "primary") ? "primary" : "standby";
      mine.push_back(row);
    }
  }
  json recent = json::array();
  for (const json& e : events.body) {
    if (e.value("node", "") == name_) recent.push_back(e);
  }
  while (recent.size() > 10) recent.erase(recent.begin());
  json all = {{"node", node.body}, {"streams", mine}, {"events", recent}};
  double now = NowUnixMs();
  return Print(all, [&](const json& j) {
    std::cout << RenderFields(j["node"],
                              {{"Name", "name"},
                               {"Role", "role"},
                               {"State", "state"},
                               {"Lifecycle", "lifecycle"},
                               {"Health", "health"},
                               {"Reasons", "reasons", CellKind::kList},
                               {"Connected", "connected"},
                               {"Fenced", "fenced"},
                               {"Server ready", "server_ready"},
                               {"Load", "load"},
                               {"Capacity", "capacity"},
                               {"CPU only", "cpu_only"},
                               {"Address", "address"}},
                              now);
    std::cout << "\nGPUs:\n"
              << RenderTable(j["node"].value("gpus", json::array()),
                             {{"index", "index"},
                              {"temp-c", "temperature_c"},
                              {"power-w", "power_w"},
                              {"util-%", "utilization_pct"},
                              {"lost", "lost"}},
                             now);
    // A server per GPU: each GPU is placed alone, with its own state.
    if (json units = j["node"].value("gpu_units", json::array()); !units.empty()) {
      std::cout << "\nGPU servers:\n"
                << RenderTable(units,
                               {{"unit", "unit"},
                                {"profile", "profile"},
                                {"in service", "in_service"},
                                {"health", "health"},
                                {"server ready", "server_ready"},
                                {"role", "role"},
                                {"load", "load"},
                                {"capacity", "capacity"},
                                {"address", "address"},
                                {"reasons", "reasons", CellKind::kList}},
                               now);
    }
    std::cout << "\nStreams:\n"
              << RenderTable(
                     j["streams"],
                     {{"id", "id"}, {"tenant", "tenant"}, {"weight", "weight"}, {"as", "as"}}, now);
    std::cout << "\nEvents:\n" << RenderTable(j["events"], EventColumns(wide()), now);
  });
}

int CtlCommand::DescribeStream() {
  Answer stream = Call("GET", "/api/v1/streams/" + name_);
  if (stream.rc != kExitOk) return stream.rc;
  Answer nodes = Call("GET", "/api/v1/nodes");
  if (nodes.rc != kExitOk) return nodes.rc;
  json on = json::array();
  for (const char* as : {"primary", "standby"}) {
    std::string who = stream.body.value(as, "");
    for (const json& n : nodes.body) {
      if (!who.empty() && n.value("name", "") == api::NodeOfUnit(who)) {
        json row = n;
        row["as"] = as;
        on.push_back(row);
      }
    }
  }
  json all = {{"stream", stream.body}, {"nodes", on}};
  double now = NowUnixMs();
  return Print(all, [&](const json& j) {
    std::cout << RenderFields(j["stream"],
                              {{"ID", "id"},
                               {"Tenant", "tenant"},
                               {"Weight", "weight"},
                               {"Primary", "primary"},
                               {"Standby", "standby"},
                               {"Placed", "placed"}},
                              now);
    std::vector<Column> columns = {{"as", "as"}};
    for (const Column& c : NodeColumns(wide())) columns.push_back(c);
    std::cout << "\nNodes:\n" << RenderTable(j["nodes"], columns, now);
  });
}

}  // namespace gpuha::cli
