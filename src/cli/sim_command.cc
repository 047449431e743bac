#include "cli/sim_command.h"

#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "sim/sim_input.h"
#include "sim/sim_report.h"
#include "sim/simulator.h"

namespace gpuha::cli {

SimCommand::SimCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "sim", "Simulate a fleet under failures and compare HA strategies in stream-hours lost");
  app_->add_option("input", input_path_, "Simulation input YAML (see examples/sim/)")->required();
  app_->add_option("-f,--format", format_, "Report format")->check(CLI::IsMember({"text", "json"}));
  app_->add_option("--svg", svg_path_,
                   "Also write a chart of availability and idle GPUs against fleet size "
                   "(sweeps sweep_nodes, or the fleet and its halvings)");
  app_->add_option("--seed", seed_, "Seed of the failure histories (overrides the input's)")
      ->check(CLI::NonNegativeNumber);
  app_->add_option("-j,--threads", threads_, "Worker threads (default: one per CPU)")
      ->check(CLI::Range(1, 256));
  app_->add_flag("--progress", progress_,
                 "Draw a progress bar on stderr even when it is not a terminal");
}

int SimCommand::Run(std::ostream& out, std::ostream& err) {
  absl::StatusOr<sim::SimInput> input = sim::LoadSimInputFile(input_path_);
  if (!input.ok()) {
    err << "gpuha sim: " << input.status().message() << "\n";
    return input.status().code() == absl::StatusCode::kInvalidArgument ||
                   input.status().code() == absl::StatusCode::kNotFound
               ? kExitBadInput
               : kExitFailure;
  }
  if (seed_ >= 0) input->seed = static_cast<uint64_t>(seed_);

  // A progress bar on long runs: drawn once a second has passed, on a
  // terminal (or when asked), and cleared at the end.
  bool draw = progress_ || isatty(STDERR_FILENO) == 1;
  auto start = std::chrono::steady_clock::now();
  std::mutex mu;
  bool drawn = false;
  auto progress = [&](const char* what, int64_t done, int64_t total) {
    if (!draw) return;
    std::lock_guard<std::mutex> lock(mu);
    if (!progress_ && std::chrono::steady_clock::now() - start < std::chrono::seconds(1)) return;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * done / std::max<int64_t>(1, total));
    err << absl::StrFormat("\r%s [%s%s] %d/%d runs", what, std::string(filled, '#'),
                           std::string(kWidth - filled, ' '), done, total)
        << std::flush;
    drawn = true;
  };
  auto clear = [&] {
    if (drawn) err << "\r" << std::string(60, ' ') << "\r" << std::flush;
    drawn = false;
  };
  sim::SimOptions options;
  options.threads =
      threads_ > 0 ? threads_ : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.progress = [&](int64_t d, int64_t t) { progress("gpuha sim", d, t); };
  sim::SimResult result = sim::Simulate(*input, options);
  clear();

  if (!svg_path_.empty()) {
    std::vector<sim::SimResult> sweep;
    std::vector<int64_t> sizes = sim::SweepSizes(*input);
    for (size_t i = 0; i < sizes.size(); ++i) {
      sim::SimInput at = *input;
      at.fleet.nodes = sizes[i];
      if (at.fleet.nodes == input->fleet.nodes) {
        sweep.push_back(result);
        continue;
      }
      options.progress = [&](int64_t d, int64_t t) {
        progress(absl::StrFormat("chart %d/%d", i + 1, sizes.size()).c_str(), d, t);
      };
      sweep.push_back(sim::Simulate(at, options));
    }
    clear();
    if (absl::Status s = common::WriteFileAtomic(svg_path_, sim::RenderSvg(sweep)); !s.ok()) {
      err << "gpuha sim: --svg: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  if (format_ == "json") {
    out << sim::RenderJson(result).dump(2) << "\n";
  } else {
    out << sim::RenderText(result, input_path_);
  }
  return kExitOk;
}

}  // namespace gpuha::cli
