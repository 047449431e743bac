#include "controller/job.h"

#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/names.h"

namespace gpuha::controller {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxGpus = 64;
constexpr int64_t kMaxCheckpointEvery = int64_t{1} << 40;
constexpr size_t kMaxArgs = 256;
constexpr size_t kMaxArgBytes = 4096;

std::optional<JobPhase> ParsePhase(std::string_view name) {
  for (JobPhase p : kJobPhases) {
    if (name == JobPhaseName(p)) return p;
  }
  return std::nullopt;
}

// Reads body[key] as an integer in [lo, hi] into *out; absent keeps *out.
absl::Status ReadInt(const json& body, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  auto it = body.find(key);
  if (it == body.end()) return absl::OkStatus();
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": must be an integer in ", lo, "..", hi, ", not ", it->dump()));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

}  // namespace

const char* JobPhaseName(JobPhase p) {
  switch (p) {
    case JobPhase::kPending:
      return "pending";
    case JobPhase::kStarting:
      return "starting";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kFencing:
      return "fencing";
    case JobPhase::kBlocked:
      return "blocked";
    case JobPhase::kDone:
      return "done";
  }
  return "unknown";
}

absl::Status CheckJobSpec(const JobSpec& s) {
  if (!common::ValidName(s.id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("id: '", absl::CHexEscape(s.id), "' must be ", common::kNameRule));
  }
  if (s.command.empty()) return absl::InvalidArgumentError("command: must name a program");
  if (s.command.size() > kMaxArgs) {
    return absl::InvalidArgumentError(absl::StrCat("command: at most ", kMaxArgs, " arguments"));
  }
  for (size_t i = 0; i < s.command.size(); ++i) {
    const std::string& a = s.command[i];
    if (a.size() > kMaxArgBytes || a.find('\0') != std::string::npos || (i == 0 && a.empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("command[", i, "]: must be ", i == 0 ? "a non-empty" : "a",
                       " string of at most ", kMaxArgBytes, " bytes without NUL"));
    }
  }
  if (s.gpus < 1 || s.gpus > kMaxGpus) {
    return absl::InvalidArgumentError(absl::StrCat("gpus: must be in 1..", kMaxGpus));
  }
  if (s.checkpoint_dir.empty() || s.checkpoint_dir[0] != '/' ||
      s.checkpoint_dir.size() > kMaxArgBytes || s.checkpoint_dir.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_dir: '", absl::CHexEscape(s.checkpoint_dir),
                     "' must be an absolute path on storage every node mounts"));
  }
  // The folder is the job's own: "/" (or "/.", "/x/..") would hold every
  // other job's folder, and a job's checkpoints land in it.
  const std::filesystem::path dir = std::filesystem::path(s.checkpoint_dir).lexically_normal();
  if (dir == dir.root_path()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_dir: '", s.checkpoint_dir,
                                                   "' is the root: give the job a folder of its "
                                                   "own on storage every node mounts"));
  }
  if (s.checkpoint_every < 1 || s.checkpoint_every > kMaxCheckpointEvery) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_every: must be in 1..", kMaxCheckpointEvery, " steps"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(const json& body) {
  if (!body.is_object()) return absl::InvalidArgumentError("body: must be a JSON object");
  for (const auto& [key, value] : body.items()) {
    if (key != "id" && key != "command" && key != "gpus" && key != "checkpoint_dir" &&
        key != "checkpoint_every") {
      return absl::InvalidArgumentError(
          absl::StrCat(absl::CHexEscape(key),
                       ": unknown field (id, command, gpus, checkpoint_dir, checkpoint_every)"));
    }
  }
  JobSpec s;
  for (auto [key, out] : {std::pair{"id", &s.id}, std::pair{"checkpoint_dir", &s.checkpoint_dir}}) {
    auto it = body.find(key);
    if (it == body.end()) return absl::InvalidArgumentError(absl::StrCat(key, ": required"));
    if (!it->is_string())
      return absl::InvalidArgumentError(absl::StrCat(key, ": must be a string"));
    *out = it->get<std::string>();
  }
  auto cmd = body.find("command");
  if (cmd == body.end()) return absl::InvalidArgumentError("command: required");
  if (!cmd->is_array()) return absl::InvalidArgumentError("command: must be an array of strings");
  for (size_t i = 0; i < cmd->size(); ++i) {
    if (!(*cmd)[i].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("command[", i, "]: must be a string"));
    }
    s.command.push_back((*cmd)[i].get<std::string>());
  }
  if (absl::Status st = ReadInt(body, "gpus", 1, kMaxGpus, &s.gpus); !st.ok()) return st;
  if (absl::Status st =
          ReadInt(body, "checkpoint_every", 1, kMaxCheckpointEvery, &s.checkpoint_every);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckJobSpec(s); !st.ok()) return st;
  std::string dir = std::filesystem::path(s.checkpoint_dir).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  s.checkpoint_dir = dir;
  return s;
}

std::vector<std::string> JobArgv(const JobSpec& s, uint64_t job_epoch) {
  std::vector<std::string> argv;
  const std::string epoch = std::to_string(job_epoch);
  const std::string every = std::to_string(s.checkpoint_every);
  for (const std::string& a : s.command) {
    argv.push_back(absl::StrReplaceAll(a, {{"{job}", s.id},
                                           {"{epoch}", epoch},
                                           {"{checkpoint_dir}", s.checkpoint_dir},
                                           {"{checkpoint_every}", every}}));
  }
  return argv;
}

json JobJson(const JobRecord& r) {
  json j = {{"id", r.spec.id},
            {"command", r.spec.command},
            {"gpus", r.spec.gpus},
            {"checkpoint_dir", r.spec.checkpoint_dir},
            {"checkpoint_every", r.spec.checkpoint_every},
            {"phase", JobPhaseName(r.phase)},
            {"node", r.node},
            {"job_epoch", r.job_epoch},
            {"step", r.step},
            {"checkpoint_step", r.checkpoint_step},
            {"takeovers", r.takeovers},
            {"last_exit", r.last_exit},
            {"restarts", r.restarts},
            {"why", r.why}};
  if (r.last) {
    const JobTakeover& t = *r.last;
    j["last_takeover"] = {{"from", t.from},
                          {"to", t.to},
                          {"planned", t.planned},
                          {"fault_unix_ms", t.fault_ms},
                          {"fenced_unix_ms", t.fenced_ms},
                          {"started_unix_ms", t.started_ms},
                          {"running_unix_ms", t.running_ms},
                          {"last_step", t.last_step},
                          {"resumed_from", t.resumed_from}};
  }
  return j;
}

std::string EncodeJob(const JobRecord& r) { return JobJson(r).dump(); }

absl::StatusOr<JobRecord> DecodeJob(const std::string& id, std::string_view text) {
  const std::string where = absl::StrCat("store: job '", absl::CHexEscape(id), "'");
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(where, ": not a JSON object"));
  JobRecord r;
  try {
    r.spec.id = j.at("id").get<std::string>();
    r.spec.command = j.at("command").get<std::vector<std::string>>();
    r.spec.gpus = j.at("gpus").get<int64_t>();
    r.spec.checkpoint_dir = j.at("checkpoint_dir").get<std::string>();
    r.spec.checkpoint_every = j.at("checkpoint_every").get<int64_t>();
    std::optional<JobPhase> phase = ParsePhase(j.at("phase").get<std::string>());
    if (!phase) return absl::DataLossError(absl::StrCat(where, ": phase: unknown"));
    r.phase = *phase;
    r.node = j.at("node").get<std::string>();
    r.job_epoch = j.at("job_epoch").get<uint64_t>();
    r.step = j.at("step").get<uint64_t>();
    r.checkpoint_step = j.at("checkpoint_step").get<uint64_t>();
    r.takeovers = j.at("takeovers").get<uint32_t>();
    r.why = j.at("why").get<std::string>();
    r.last_exit = j.value("last_exit", "");
    r.restarts = j.value("restarts", uint32_t{0});
    if (auto it = j.find("last_takeover"); it != j.end()) {
      JobTakeover t;
      t.from = it->at("from").get<std::string>();
      t.to = it->at("to").get<std::string>();
      t.planned = it->at("planned").get<bool>();
      t.fault_ms = it->at("fault_unix_ms").get<double>();
      t.fenced_ms = it->at("fenced_unix_ms").get<double>();
      t.started_ms = it->at("started_unix_ms").get<double>();
      t.running_ms = it->at("running_unix_ms").get<double>();
      t.last_step = it->at("last_step").get<uint64_t>();
      t.resumed_from = it->at("resumed_from").get<uint64_t>();
      r.last = t;
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(where, ": ", e.what()));
  }
  if (r.spec.id != id) {
    return absl::DataLossError(
        absl::StrCat(where, ": its id field says '", absl::CHexEscape(r.spec.id), "'"));
  }
  if (absl::Status s = CheckJobSpec(r.spec); !s.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", s.message()));
  }
  return r;
}

std::string PickJobNode(const std::vector<JobCandidate>& candidates, int64_t gpus, bool move,
                        const std::string& prefer) {
  using placement::Role;
  auto rank = [&](const JobCandidate& c) {
    if (move) {
      return c.node == prefer ? 0 : c.role == Role::kPassive ? 1 : c.role == Role::kBuffer ? 2 : 3;
    }
    return c.role == Role::kActive ? 0 : c.role == Role::kPassive ? 1 : 2;
  };
  const JobCandidate* best = nullptr;
  for (const JobCandidate& c : candidates) {
    if (c.free_gpus < gpus) continue;
    if (best == nullptr || rank(c) < rank(*best)) best = &c;
  }
  return best == nullptr ? "" : best->node;
}

}  // namespace gpuha::controller
