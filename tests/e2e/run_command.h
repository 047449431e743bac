// Runs a shell command for an end-to-end test and captures what it printed.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/testing/temp_dir.h"

namespace gpuha::e2e {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `command` runs under /bin/sh; `stdin_text` is fed to it.
inline CommandResult RunCommand(const std::string& command, const std::string& stdin_text = "") {
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("gpuha_cmd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "in") << stdin_text;
  std::string full = "timeout 60 " + command + " <" + (dir / "in").string() + " >" +
                     (dir / "out").string() + " 2>" + (dir / "err").string();
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = Slurp(dir / "out");
  r.err = Slurp(dir / "err");
  return r;
}

}  // namespace gpuha::e2e
