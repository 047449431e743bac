// `gpuha completion bash|zsh|fish`: a completion script for the whole
// command tree, written from the CLI11 definitions so it cannot drift from
// the flags: subcommands, flags, and the choices of options and arguments
// that CLI11 checks with IsMember (-o table|wide|json|yaml, ROLE, SHELL).
//
//   source <(gpuha completion bash)
//   gpuha completion zsh > "${fpath[1]}/_gpuha"
//   gpuha completion fish > ~/.config/fish/completions/gpuha.fish
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace gpuha::cli {

class CompletionCommand {
 public:
  explicit CompletionCommand(CLI::App& parent);
  // Prints the script for `root`'s whole tree.
  int Run(const CLI::App& root) const;
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string shell_;
};

// The script itself, for tests.
std::string CompletionScript(const CLI::App& root, const std::string& shell);

}  // namespace gpuha::cli
