// DumpDom: a page as a real headless Chromium renders it, with its own JS
// run (the dashboard's tests read the DOM it leaves).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/testing/temp_dir.h"
#include "tests/e2e/child_process.h"

namespace gpuha::e2e {

// The dashboard in a real headless Chromium: the page at `/` renders the
// cluster from /api/v1 (nodes, streams, failovers, events) with its own JS.
inline std::string DumpDom(const std::string& url) {
  const std::string chromium = "/usr/bin/chromium-headless-shell";
  if (!std::filesystem::exists(chromium)) {
    ADD_FAILURE() << chromium << " is missing: run scripts/install-deps.sh";
    return "";
  }
  // --virtual-time-budget runs the page's timers and waits out its fetches.
  ChildProcess browser({chromium, "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--user-data-dir=" + gpuha::testing::TestTempDir().string() + "/chromium",
                        "--virtual-time-budget=3000", "--dump-dom", url});
  EXPECT_EQ(browser.Wait(std::chrono::milliseconds(60000)).value_or(-1), 0) << browser.err();
  return browser.out();
}

}  // namespace gpuha::e2e
