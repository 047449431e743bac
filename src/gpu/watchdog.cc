#include "gpu/watchdog.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace gpuha::gpu {
namespace {

constexpr uint32_t kMaxGpus = 1024;  // a bound on callers; NVML reports far fewer

}  // namespace

// One thread that runs one call at a time. The state is shared with the
// thread so that a thread stuck in a call can outlive its Caller.
class WatchedProbe::Caller {
 public:
  Caller() : s_(std::make_shared<State>()) { thread_ = std::thread(Loop, s_); }
  ~Caller() {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stopping = true;
      busy = s_->busy;
    }
    s_->cv.notify_all();
    if (busy) {
      thread_.detach();  // stuck in the driver; it exits when the call returns
    } else {
      thread_.join();
    }
  }

  // Runs fn() on the thread. nullopt when it did not return within
  // `deadline`; `*stuck_for` then says how long the call has been running
  // (0 for this call, more for an earlier one that is still stuck, in which
  // case fn is not run at all).
  template <typename T>
  std::optional<T> Call(std::function<T()> fn, common::Duration deadline,
                        common::Duration* stuck_for, bool* missed) {
    auto result = std::make_shared<std::optional<T>>();
    std::unique_lock<std::mutex> lock(s_->mu);
    *missed = false;
    if (s_->busy) {
      *stuck_for = std::chrono::duration_cast<common::Duration>(std::chrono::steady_clock::now() -
                                                                s_->started);
      return std::nullopt;
    }
    s_->busy = true;
    s_->started = std::chrono::steady_clock::now();
    s_->job = [fn = std::move(fn), result] { *result = fn(); };
    const uint64_t seq = ++s_->submitted;
    s_->cv.notify_all();
    if (!s_->cv.wait_for(lock, deadline, [&] { return s_->finished >= seq; })) {
      *stuck_for = deadline;
      *missed = true;
      return std::nullopt;
    }
    return std::move(*result);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> job;  // guarded by mu
    bool busy = false;          // a job is queued or running
    bool stopping = false;
    uint64_t submitted = 0, finished = 0;
    std::chrono::steady_clock::time_point started;
  };

  static void Loop(std::shared_ptr<State> s) {
    std::unique_lock<std::mutex> lock(s->mu);
    while (true) {
      s->cv.wait(lock, [&] { return s->stopping || s->job != nullptr; });
      if (s->job == nullptr) return;  // stopping and idle
      std::function<void()> job = std::move(s->job);
      s->job = nullptr;
      lock.unlock();
      job();
      lock.lock();
      s->busy = false;
      ++s->finished;
      s->cv.notify_all();
      if (s->stopping) return;
    }
  }

  std::shared_ptr<State> s_;
  std::thread thread_;
};

std::unique_ptr<WatchedProbe> WatchedProbe::Wrap(std::unique_ptr<GpuProbe> inner,
                                                 common::Duration deadline) {
  return std::unique_ptr<WatchedProbe>(new WatchedProbe(std::move(inner), deadline));
}

WatchedProbe::WatchedProbe(std::shared_ptr<GpuProbe> inner, common::Duration deadline)
    : inner_(std::move(inner)),
      deadline_(deadline),
      backend_(inner_->Backend()),
      devices_caller_(std::make_unique<Caller>()) {}

WatchedProbe::~WatchedProbe() = default;

uint64_t WatchedProbe::hung_calls() const { return hung_calls_.load(); }

WatchedProbe::Caller* WatchedProbe::CallerFor(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (callers_.size() <= index) callers_.resize(index + 1);
  if (!callers_[index]) callers_[index] = std::make_unique<Caller>();
  return callers_[index].get();
}

absl::StatusOr<std::vector<DeviceInfo>> WatchedProbe::Devices() {
  common::Duration stuck_for{};
  bool missed = false;
  std::shared_ptr<GpuProbe> inner = inner_;
  auto r = devices_caller_->Call<absl::StatusOr<std::vector<DeviceInfo>>>(
      [inner] { return inner->Devices(); }, deadline_, &stuck_for, &missed);
  if (missed) hung_calls_++;
  if (!r) {
    return absl::UnavailableError(absl::StrCat("the ", backend_,
                                               " driver did not list its GPUs within ",
                                               common::ToMillis(deadline_), " ms"));
  }
  return std::move(*r);
}

absl::StatusOr<GpuSample> WatchedProbe::Sample(uint32_t index) {
  if (index >= kMaxGpus) {
    return absl::OutOfRangeError(absl::StrCat("GPU index ", index, " out of range"));
  }
  common::Duration stuck_for{};
  bool missed = false;
  std::shared_ptr<GpuProbe> inner = inner_;
  auto r = CallerFor(index)->Call<absl::StatusOr<GpuSample>>(
      [inner, index] { return inner->Sample(index); }, deadline_, &stuck_for, &missed);
  if (missed) hung_calls_++;
  if (r) return std::move(*r);
  GpuSample s;
  s.index = index;
  s.lost = true;
  s.lost_detail =
      absl::StrCat("the ", backend_, " driver has not answered for ", common::ToMillis(stuck_for),
                   " ms (watchdog deadline ", common::ToMillis(deadline_), " ms)");
  return s;
}

absl::StatusOr<std::vector<XidEvent>> WatchedProbe::WaitForXids(std::chrono::milliseconds timeout) {
  return inner_->WaitForXids(timeout);
}

}  // namespace gpuha::gpu
