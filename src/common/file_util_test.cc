#include "common/file_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "common/testing/temp_dir.h"

namespace gpuha::common {
namespace {

std::string TempPath(const char* name) { return (gpuha::testing::TestTempDir() / name).string(); }

TEST(FileUtilTest, WriteThenReadRoundTrips) {
  std::string path = TempPath("roundtrip.txt");
  ASSERT_TRUE(WriteFileAtomic(path, "hello\n").ok());
  absl::StatusOr<std::string> text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "hello\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(FileUtilTest, ReadMissingFileNamesPath) {
  absl::StatusOr<std::string> text = ReadFile("/nonexistent/gpuha.yaml");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(text.status().message(), ::testing::HasSubstr("/nonexistent/gpuha.yaml"));
}

// Regression: a directory opened as a file read as "" (an empty config,
// which for the router meant no tenants: authentication off).
TEST(FileUtilTest, ReadingADirectoryIsAnErrorNotAnEmptyFile) {
  std::string dir = gpuha::testing::TestTempDir().string();
  absl::StatusOr<std::string> text = ReadFile(dir);
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), ::testing::HasSubstr(dir + ": is a directory"));
}

TEST(FileUtilTest, WriteIntoMissingDirectoryFailsCleanly) {
  absl::Status s = WriteFileAtomic("/nonexistent/dir/out.yaml", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::HasSubstr("/nonexistent/dir/out.yaml.tmp"));
}

}  // namespace
}  // namespace gpuha::common
