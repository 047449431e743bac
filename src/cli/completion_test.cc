// The completion scripts, run in the shells they are for: each is sourced
// and asked to complete partial command lines of the real command tree.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/completion_command.h"
#include "cli/ctl_command.h"

namespace gpuha::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::IsSupersetOf;
using ::testing::UnorderedElementsAre;

std::string Shell(const std::string& command) {
  std::string out;
  FILE* f = ::popen(command.c_str(), "r");
  if (f == nullptr) return "popen failed";
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  ::pclose(f);
  return out;
}

std::vector<std::string> Split(const std::string& s) {
  return absl::StrSplit(s, absl::ByAnyChar(" \n"), absl::SkipEmpty());
}

class CompletionTest : public ::testing::Test {
 protected:
  CompletionTest() : ctl_(root_), completion_(root_) {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("gpuha-completion-", ::getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  ~CompletionTest() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& shell) {
    std::string path = (dir_ / ("gpuha." + shell)).string();
    std::ofstream(path) << CompletionScript(root_, shell);
    return path;
  }
  // What bash offers for `line` (the last word is the one completed).
  std::vector<std::string> Bash(const std::string& line) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    std::string array;
    for (const std::string& w : words) absl::StrAppend(&array, "'", w, "' ");
    return Split(
        Shell(absl::StrCat("bash -c 'source \"$0\"; COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); "
                           "_gpuha; echo \"${COMPREPLY[*]}\"' ",
                           Write("bash"), " ", array)));
  }
  std::vector<std::string> Zsh(const std::string& line) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    std::string array;
    for (const std::string& w : words) absl::StrAppend(&array, "'", w, "' ");
    // compadd only works inside the completion system: stand-ins print what
    // it was given.
    return Split(Shell(absl::StrCat(
        "zsh -f -c 'compadd() { [[ $1 == -- ]] && shift; print -r -- \"$*\" }; "
        "_files() { print FILES }; compdef() { }; source \"$0\"; words=(\"$@\"); CURRENT=$#; "
        "_gpuha' ",
        Write("zsh"), " ", array)));
  }
  std::vector<std::string> Fish(const std::string& line) {
    std::string out =
        Shell(absl::StrCat("fish --no-config -c 'source $argv[1]; complete -C $argv[2]' ",
                           Write("fish"), " '", line, "'"));
    std::vector<std::string> first;
    for (absl::string_view l : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
      first.emplace_back(l.substr(0, l.find('\t')));
    }
    return first;
  }

  CLI::App root_{"gpuha"};
  CtlCommand ctl_;
  CompletionCommand completion_;
  std::filesystem::path dir_;
};

TEST_F(CompletionTest, BashCompletesCommandsFlagsAndChoices) {
  EXPECT_THAT(Bash("gpuha c"), UnorderedElementsAre("ctl", "completion"));
  EXPECT_THAT(Bash("gpuha ctl des"), ElementsAre("describe"));
  EXPECT_THAT(Bash("gpuha ctl describe "), UnorderedElementsAre("node", "stream"));
  EXPECT_THAT(Bash("gpuha ctl nodes -o "), UnorderedElementsAre("table", "wide", "json", "yaml"));
  // The parent's flags follow a verb (CLI11 fallthrough).
  EXPECT_THAT(Bash("gpuha ctl describe node --con"), ElementsAre("--controller"));
  EXPECT_THAT(Bash("gpuha ctl events --"), IsSupersetOf({"--since", "--watch", "--token"}));
  EXPECT_THAT(Bash("gpuha ctl set-role n1 "), IsSupersetOf({"active", "passive", "buffer"}));
  EXPECT_THAT(Bash("gpuha completion "), UnorderedElementsAre("bash", "zsh", "fish"));
  // A flag without a value (--watch) is not followed by file names.
  EXPECT_THAT(Bash("gpuha ctl events --watch "), ::testing::IsEmpty());
}

TEST_F(CompletionTest, ZshCompletesCommandsFlagsAndChoices) {
  EXPECT_THAT(Zsh("gpuha c"), IsSupersetOf({"ctl", "completion"}));
  EXPECT_THAT(Zsh("gpuha ctl describe "), UnorderedElementsAre("node", "stream"));
  EXPECT_THAT(Zsh("gpuha ctl nodes -o "), UnorderedElementsAre("table", "wide", "json", "yaml"));
  EXPECT_THAT(Zsh("gpuha ctl --controller "), ElementsAre("FILES"));
  EXPECT_THAT(Zsh("gpuha ctl events -"), IsSupersetOf({"--since", "--watch", "--controller"}));
  EXPECT_THAT(Zsh("gpuha completion "), UnorderedElementsAre("bash", "zsh", "fish"));
}

TEST_F(CompletionTest, FishCompletesCommandsFlagsAndChoices) {
  EXPECT_THAT(Fish("gpuha c"), UnorderedElementsAre("ctl", "completion"));
  EXPECT_THAT(Fish("gpuha ctl describe "), UnorderedElementsAre("node", "stream"));
  EXPECT_THAT(Fish("gpuha ctl nodes -o "), UnorderedElementsAre("table", "wide", "json", "yaml"));
  EXPECT_THAT(Fish("gpuha ctl events --"), IsSupersetOf({"--since", "--watch", "--controller"}));
  EXPECT_THAT(Fish("gpuha completion "), UnorderedElementsAre("bash", "zsh", "fish"));
  EXPECT_THAT(Fish("gpuha ctl drain --"), ::testing::Contains("--force"));
  // A verb's flags stay with it and its subcommands: `fail` is a prefix of
  // `failovers`, not its parent.
  EXPECT_THAT(
      CompletionScript(root_, "fish"),
      ::testing::HasSubstr("string match -q -r -- \\'^gpuha/ctl/fail(/|$)\\' (__gpuha_path)"));
}

}  // namespace
}  // namespace gpuha::cli
