// TestTempDir: a fresh directory for the running test, unique across the
// parallel processes ctest starts, so tests never share files. The first call
// in a test empties it: a process id is reused, across runs on one machine
// and in containers whose pids start low, and a file left by an earlier run
// (a log opened for append) must not reach this one.
//
// When the test ends, its directory goes if it passed (a run of every test
// once left 2 GB behind, an etcd test 245 MB of it), and stays if it failed,
// its path printed beside the failure: a cluster's logs are there.
// GPUHA_KEEP_TEST_DIRS=1 keeps every one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

namespace gpuha::testing {

namespace internal {

// The directory the running test made, if any.
inline std::filesystem::path& CurrentTestDir() {
  static std::filesystem::path dir;
  return dir;
}

class TestDirJanitor : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    std::filesystem::path& dir = CurrentTestDir();
    if (dir.empty()) return;
    if (info.result()->Failed()) {
      std::cout << "[  FILES   ] " << info.test_suite_name() << "." << info.name()
                << ": its files and logs are kept in " << dir.string() << std::endl;
    } else if (std::getenv("GPUHA_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    dir.clear();
  }
};

// Registered once per test program, before main runs the tests.
inline const bool kJanitorRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new TestDirJanitor);
  return true;
}();

}  // namespace internal

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
  internal::CurrentTestDir() = dir;
  return dir;
}

}  // namespace gpuha::testing
