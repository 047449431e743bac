#include "agent/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "agent/job_supervisor.h"
#include "agent/process.h"
#include "agent/testing/fake_process_runner.h"
#include "common/testing/temp_dir.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeProcessRunner;

class SupervisorTest : public ::testing::Test {
 protected:
  SupervisorOptions Options() {
    SupervisorOptions o;
    o.command = {"worker"};
    o.ready_url = "http://127.0.0.1:1/ready";
    o.probe_interval = milliseconds(100);
    o.stop_grace = seconds(2);
    return o;
  }
  common::FakeClock clock_;
  FakeProcessRunner runner_;
  bool ready_ = true;
};

TEST_F(SupervisorTest, StartsServerAndReportsReadiness) {
  Supervisor s(Options(), &runner_, &clock_, [&] { return ready_; });
  s.Tick();
  EXPECT_TRUE(s.state().running);
  EXPECT_TRUE(s.state().ready);
  // One failed probe of a server that answered is not a verdict (a loaded
  // host delays a probe now and then); two in a row are.
  ready_ = false;
  clock_.Advance(milliseconds(100));
  s.Tick();
  EXPECT_TRUE(s.state().ready);
  clock_.Advance(milliseconds(100));
  s.Tick();
  EXPECT_FALSE(s.state().ready);
  EXPECT_TRUE(s.state().running);
  // Ready again at the first good probe.
  ready_ = true;
  clock_.Advance(milliseconds(100));
  s.Tick();
  EXPECT_TRUE(s.state().ready);
}

// A probe the host kept from running (its thread starved of CPU: found
// beside a busy loop, two such timeouts failed a healthy node over) is no
// reading: the verdict stands however many come, and the failures around
// them still need two in a row.
TEST_F(SupervisorTest, AProbeTheHostKeptFromRunningIsNoReading) {
  ProbeReading reading = true;
  Supervisor s(Options(), &runner_, &clock_, [&] { return reading; });
  s.Tick();
  ASSERT_TRUE(s.state().ready);
  for (ProbeReading r : {ProbeReading(), ProbeReading(), ProbeReading(), ProbeReading(false),
                         ProbeReading(), ProbeReading()}) {
    reading = r;
    clock_.Advance(milliseconds(100));
    s.Tick();
    EXPECT_TRUE(s.state().ready);
  }
  reading = false;  // the second failure in a row
  clock_.Advance(milliseconds(100));
  s.Tick();
  EXPECT_FALSE(s.state().ready);
  reading = std::nullopt;  // and no reading does not make it ready again
  clock_.Advance(milliseconds(100));
  s.Tick();
  EXPECT_FALSE(s.state().ready);
}

TEST_F(SupervisorTest, RestartsWithDoublingBackoffThenResetsAfterStableMinute) {
  Supervisor s(Options(), &runner_, &clock_, [&] { return true; });
  s.Tick();
  std::vector<int64_t> waits;
  for (int i = 0; i < 8; ++i) {
    runner_.Crash(runner_.last_pid);
    s.Tick();  // notices the exit
    int spawns = runner_.spawns;
    int64_t waited = 0;
    while (runner_.spawns == spawns) {
      clock_.Advance(milliseconds(500));
      waited += 500;
      s.Tick();
    }
    waits.push_back(waited);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000}));
  EXPECT_EQ(s.state().restarts, 8u);
  EXPECT_EQ(s.state().last_exit, "exit 1");
  clock_.Advance(seconds(61));  // a stable minute
  runner_.Crash(runner_.last_pid);
  s.Tick();
  int spawns = runner_.spawns;
  clock_.Advance(milliseconds(1000));
  s.Tick();
  EXPECT_EQ(runner_.spawns, spawns + 1);
}

// A probe round over a ReadyBatch: the servers due are asked at once, each
// probe takes its own answer of this round only, and one hung server costs
// the round one timeout (not one per server).
TEST_F(SupervisorTest, AReadyBatchAsksTheServersDueAtOnce) {
  std::atomic<int> asked{0};
  std::vector<std::unique_ptr<common::HttpServer>> up;
  for (int i = 0; i < 3; ++i) {
    auto srv = common::HttpServer::Start(
        {.address = "127.0.0.1", .port = 0}, [&, i](const common::HttpRequest&) {
          ++asked;
          return common::HttpResponse{i == 1 ? 503 : 200, "text/plain", "", {}};
        });
    ASSERT_TRUE(srv.ok());
    up.push_back(std::move(*srv));
  }
  // Four servers that take the connection and never answer.
  boost::asio::io_context io;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> mute;
  ReadyBatch batch;
  std::vector<std::function<ProbeReading()>> probes;
  for (int i = 0; i < 7; ++i) {
    uint16_t port = 0;
    if (i < 3) {
      port = up[i]->port();
    } else {
      mute.push_back(std::make_unique<boost::asio::ip::tcp::acceptor>(
          io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)));
      port = mute.back()->local_endpoint().port();
    }
    SupervisorOptions o;
    o.ready_url = absl::StrCat("http://127.0.0.1:", port, "/ready");
    o.probe_timeout = milliseconds(300);
    std::optional<size_t> slot;
    probes.push_back(ServerProbe(o, "n", &clock_, &batch, &slot));
    EXPECT_EQ(slot, static_cast<size_t>(i));
  }
  const auto t0 = std::chrono::steady_clock::now();
  batch.Fetch({0, 1, 2, 3, 4, 5, 6}, milliseconds(300));
  // One timeout for the round; asked one by one, the four would take 1.2 s.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
  EXPECT_EQ(asked.load(), 3);
  std::vector<ProbeReading> got;
  for (auto& p : probes) got.push_back(p());
  ASSERT_EQ(got.size(), 7u);
  EXPECT_EQ(got[0], ProbeReading(true));
  EXPECT_EQ(got[2], ProbeReading(true));
  // Not ready: false, or no reading where this thread itself waited for a
  // CPU for half the round (a loaded host); never ready.
  for (size_t i : {1, 3, 4, 5, 6}) EXPECT_NE(got[i], ProbeReading(true)) << i;
  EXPECT_EQ(asked.load(), 3);  // taken from the round
  // The next round forgets this one: a probe without an answer asks alone.
  batch.Fetch({}, milliseconds(300));
  EXPECT_EQ(probes[0](), ProbeReading(true));
  EXPECT_EQ(asked.load(), 4);
}

TEST_F(SupervisorTest, FenceStopsTheServerWithTermThenKill) {
  runner_.dies_on_term = false;
  Supervisor s(Options(), &runner_, &clock_, [&] { return true; });
  s.Tick();
  s.Fence();
  EXPECT_FALSE(s.state().ready);
  s.Tick();
  EXPECT_EQ(runner_.signals, std::vector<int>{SIGTERM});
  clock_.Advance(seconds(2));
  s.Tick();
  EXPECT_EQ(runner_.signals, (std::vector<int>{SIGTERM, SIGKILL}));
  s.Tick();
  EXPECT_FALSE(s.state().running);
  clock_.Advance(seconds(30));
  s.Tick();
  EXPECT_FALSE(s.state().running) << "a fenced server must not be restarted";
  s.Unfence();
  s.Tick();
  EXPECT_TRUE(s.state().running);
  EXPECT_TRUE(s.state().ready);
}

// A fence lifted while its stop is under way (the server was SIGSTOPped, so
// the SIGTERM waits): the old server is not taken for ready; it is stopped
// (killed after the grace), and a new one starts.
TEST_F(SupervisorTest, AStopUnderWayRunsToItsEndWhenTheFenceIsLifted) {
  runner_.dies_on_term = false;
  Supervisor s(Options(), &runner_, &clock_, [&] { return true; });
  s.Tick();
  const pid_t old = runner_.last_pid;
  s.Fence();
  s.Tick();
  EXPECT_EQ(runner_.signals, std::vector<int>{SIGTERM});
  clock_.Advance(milliseconds(500));
  s.Unfence();
  s.Tick();
  EXPECT_FALSE(s.state().ready) << "the server that got SIGTERM is about to exit";
  EXPECT_EQ(runner_.spawns, 1);
  clock_.Advance(milliseconds(1500));  // the grace is over
  s.Tick();
  EXPECT_EQ(runner_.signals, (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_FALSE(runner_.alive[old]);
  s.Tick();  // notices the exit and starts a new one
  EXPECT_EQ(runner_.spawns, 2);
  EXPECT_TRUE(s.state().running);
  EXPECT_NE(s.state().pid, old);
  EXPECT_TRUE(s.state().ready);
}

TEST_F(SupervisorTest, UnreadyFenceKeepsTheServerRunning) {
  SupervisorOptions o = Options();
  o.fence_mode = FenceMode::kUnready;
  Supervisor s(o, &runner_, &clock_, [&] { return true; });
  s.Tick();
  s.Fence();
  s.Tick();
  EXPECT_TRUE(s.state().running);
  EXPECT_FALSE(s.state().ready);
  EXPECT_TRUE(runner_.signals.empty());
}

TEST_F(SupervisorTest, SpawnFailureIsRetriedWithBackoff) {
  runner_.fail_spawn = true;
  Supervisor s(Options(), &runner_, &clock_, [&] { return true; });
  s.Tick();
  EXPECT_FALSE(s.state().running);
  EXPECT_EQ(s.state().last_exit, "cannot run 'worker'");
  runner_.fail_spawn = false;
  clock_.Advance(milliseconds(999));
  s.Tick();
  EXPECT_FALSE(s.state().running);
  clock_.Advance(milliseconds(1));
  s.Tick();
  EXPECT_TRUE(s.state().running);
}

TEST_F(SupervisorTest, NoCommandMeansNothingSupervised) {
  SupervisorOptions o;
  Supervisor s(o, &runner_, &clock_, [&] { return true; });
  s.Tick();
  EXPECT_FALSE(s.state().supervised);
  EXPECT_EQ(runner_.spawns, 0);
}

// A server the agent does not start (a Triton pod beside a DaemonSet agent)
// is probed: ready follows the probe, a fence makes it unready, and nothing
// is ever spawned or signalled.
TEST_F(SupervisorTest, AServerWithAReadyUrlButNoCommandIsWatched) {
  SupervisorOptions o;
  o.ready_url = "http://127.0.0.1:8000/v2/health/ready";
  bool answering = false;
  int probes = 0;
  Supervisor s(o, &runner_, &clock_, [&] {
    ++probes;
    return answering;
  });
  s.Tick();
  EXPECT_FALSE(s.state().supervised);
  EXPECT_TRUE(s.state().watched);
  EXPECT_FALSE(s.state().ready);
  answering = true;
  s.Tick();  // within the probe interval: the last verdict stands
  EXPECT_FALSE(s.state().ready);
  clock_.Advance(o.probe_interval);
  s.Tick();
  EXPECT_TRUE(s.state().ready);
  EXPECT_EQ(probes, 2);
  s.Fence();
  clock_.Advance(o.probe_interval);
  s.Tick();
  EXPECT_FALSE(s.state().ready);
  s.Unfence();
  clock_.Advance(o.probe_interval);
  s.Tick();
  EXPECT_TRUE(s.state().ready);
  EXPECT_EQ(runner_.spawns, 0);
}

TEST(RealProcessRunnerTest, RunsReportsExitAndSignals) {
  RealProcessRunner r;
  auto pid = r.Spawn({"sh", "-c", "exit 3"});
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<std::string> exit;
  for (int i = 0; i < 200 && !exit; ++i) {
    exit = r.Poll(*pid);
    usleep(10000);
  }
  EXPECT_EQ(exit, "exit 3");
  auto sleeper = r.Spawn({"sleep", "30"});
  ASSERT_TRUE(sleeper.ok());
  r.Signal(*sleeper, SIGKILL);
  exit.reset();
  for (int i = 0; i < 200 && !exit; ++i) {
    exit = r.Poll(*sleeper);
    usleep(10000);
  }
  EXPECT_EQ(exit, "signal 9");
  auto missing = r.Spawn({"/nonexistent/worker"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("cannot run '/nonexistent/worker'"),
            std::string::npos);
}

// --- JobSupervisor -----------------------------------------------------------

class JobSupervisorTest : public ::testing::Test {
 protected:
  JobOptions Options() {
    JobOptions o;
    o.progress_dir = "/nonexistent/progress";
    o.stop_grace = seconds(10);
    o.backoff.initial = seconds(1);
    return o;
  }
  v1::StartJob Start(uint64_t job_epoch) {
    v1::StartJob s;
    s.set_job("train-1");
    s.set_job_epoch(job_epoch);
    s.add_argv("trainer");
    s.add_argv("--progress-file");
    s.add_argv("{progress_file}");
    return s;
  }
  v1::JobStatus Only(const JobSupervisor& j) {
    auto all = j.Status();
    EXPECT_EQ(all.size(), 1u);
    return all.empty() ? v1::JobStatus() : all[0];
  }
  common::FakeClock clock_;
  FakeProcessRunner runner_;
};

TEST_F(JobSupervisorTest, RunsAJobRestartsItAfterACrashAndStopsWhenItIsDone) {
  JobSupervisor jobs(Options(), &runner_, &clock_);
  jobs.Start(Start(3));
  jobs.Tick();
  ASSERT_EQ(runner_.spawns, 1);
  EXPECT_EQ(runner_.last_argv[2], "/nonexistent/progress/train-1.3.progress");
  EXPECT_TRUE(Only(jobs).running());
  runner_.Crash(runner_.last_pid);  // exit 1
  jobs.Tick();
  EXPECT_FALSE(Only(jobs).running());
  EXPECT_EQ(Only(jobs).restarts(), 1u);
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 1) << "restarts wait for the backoff";
  clock_.Advance(seconds(2));
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 2);
  runner_.exit_text = "exit 0";
  runner_.Crash(runner_.last_pid);
  jobs.Tick();
  clock_.Advance(seconds(120));
  jobs.Tick();
  EXPECT_TRUE(Only(jobs).done());
  EXPECT_EQ(runner_.spawns, 2) << "a finished job is not run again";
  // A repeat of the same placement changes nothing.
  jobs.Start(Start(3));
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 2);
}

TEST_F(JobSupervisorTest, AFenceStopsJobsWithSigtermThenSigkillAndNoneRestarts) {
  JobSupervisor jobs(Options(), &runner_, &clock_);
  jobs.Start(Start(3));
  jobs.Tick();
  runner_.dies_on_term = false;  // it takes its time to checkpoint
  jobs.StopAll();
  jobs.Tick();
  EXPECT_EQ(runner_.signals, std::vector<int>{SIGTERM});
  EXPECT_TRUE(jobs.AnyRunning());
  clock_.Advance(seconds(11));
  jobs.Tick();
  EXPECT_EQ(runner_.signals, (std::vector<int>{SIGTERM, SIGKILL}));
  jobs.Tick();
  EXPECT_FALSE(jobs.AnyRunning());
  EXPECT_TRUE(Only(jobs).stopped());
  clock_.Advance(seconds(120));
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 1);
}

TEST_F(JobSupervisorTest, ANewerPlacementReplacesTheOldOneOnceItEndsAndAFencedJobIsNotRestarted) {
  JobSupervisor jobs(Options(), &runner_, &clock_);
  jobs.Start(Start(3));
  jobs.Tick();
  const pid_t old_pid = runner_.last_pid;
  runner_.dies_on_term = false;  // it checkpoints first
  jobs.Start(Start(5));
  EXPECT_EQ(runner_.signals, std::vector<int>{SIGTERM});
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 1) << "the new placement started beside the old one";
  // The old one is still reported while it runs: its fence is not done.
  auto all = jobs.Status();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(all[0].running() || all[1].running());
  runner_.Crash(old_pid);
  jobs.Tick();
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 2);
  EXPECT_EQ(Only(jobs).job_epoch(), 5u);
  jobs.Start(Start(4));  // older: ignored
  EXPECT_EQ(Only(jobs).job_epoch(), 5u);
  // Its storage refused it (a later placement elsewhere): not restarted.
  runner_.exit_text = "exit 4";
  runner_.Crash(runner_.last_pid);
  jobs.Tick();
  clock_.Advance(seconds(120));
  jobs.Tick();
  EXPECT_EQ(runner_.spawns, 2);
  EXPECT_EQ(Only(jobs).last_exit(), "exit 4");
}

// An XID's process is the server's work when the server is it or an
// ancestor of it (Triton's backend stubs are its children), read from
// /proc's parent links; a name with spaces and parentheses is no trouble.
TEST(InProcessTreeTest, FollowsParentLinksUpToTheRoot) {
  std::filesystem::path proc = gpuha::testing::TestTempDir() / "proc";
  auto add = [&](int pid, const std::string& comm, int ppid) {
    std::filesystem::create_directories(proc / std::to_string(pid));
    std::ofstream(proc / std::to_string(pid) / "stat")
        << pid << " (" << comm << ") S " << ppid << " " << pid << " 0 0\n";
  };
  add(100, "tritonserver", 1);
  add(120, "triton_python_backend_stub (x) y", 100);
  add(130, "python3", 120);
  add(200, "python3", 1);
  EXPECT_TRUE(InProcessTree(100, 100, proc.string()));
  EXPECT_TRUE(InProcessTree(100, 130, proc.string()));
  EXPECT_FALSE(InProcessTree(100, 200, proc.string()));
  EXPECT_FALSE(InProcessTree(100, 999, proc.string()));  // gone
  EXPECT_FALSE(InProcessTree(0, 130, proc.string()));
  // The real /proc: this test is in its own tree, not in init's child's.
  EXPECT_TRUE(InProcessTree(::getpid(), ::getpid()));
  EXPECT_TRUE(InProcessTree(::getppid(), ::getpid()));
}

// RESTART_APP: a running server is stopped and started again at once.
TEST_F(SupervisorTest, RestartStopsTheServerAndStartsItAgain) {
  Supervisor s(Options(), &runner_, &clock_, [] { return true; });
  s.Tick();
  const pid_t first = s.state().pid;
  ASSERT_TRUE(s.state().running);
  EXPECT_TRUE(s.Restart("XID 13 from its process"));
  EXPECT_FALSE(s.Restart("again"));  // already stopping
  s.Tick();                          // the fake died at the SIGTERM: started again
  s.Tick();
  EXPECT_TRUE(s.state().running);
  EXPECT_NE(s.state().pid, first);
  EXPECT_EQ(s.state().restarts, 1u);
}

}  // namespace
}  // namespace gpuha::agent
