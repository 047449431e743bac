// TestTempDir: a fresh directory for the running test, unique across the
// parallel processes ctest starts, so tests never share files. The first call
// in a test empties it: a process id is reused, across runs on one machine
// and in containers whose pids start low, and a file left by an earlier run
// (a log opened for append) must not reach this one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace gpuha::testing {

inline std::filesystem::path TestTempDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string("gpuha_") + info->test_suite_name() + "_" + info->name() + "_" +
                     std::to_string(::getpid());
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  static const ::testing::TestInfo* emptied_for = nullptr;
  if (emptied_for != info) {
    std::filesystem::remove_all(dir);
    emptied_for = info;
  }
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace gpuha::testing
