#include "gpu/watchdog.h"

#include <condition_variable>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace gpuha::gpu {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint32_t kMaxGpus = 1024;  // a bound on callers; NVML reports far fewer

}  // namespace

// One thread that runs one call at a time. The state is shared with the
// thread so that a thread stuck in a call can outlive its Caller; so is each
// call's result slot, which the thread may fill after its caller gave up.
class WatchedProbe::Caller {
 public:
  template <typename T>
  struct Ticket {
    std::shared_ptr<std::optional<T>> result;
    uint64_t seq = 0;
  };

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

  // Starts fn() on the thread. nullopt when an earlier call is still running
  // (fn is not run); `*stuck_for` then says for how long.
  template <typename T>
  std::optional<Ticket<T>> Start(std::function<T()> fn, common::Duration* stuck_for) {
    Ticket<T> t{std::make_shared<std::optional<T>>()};
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (s_->busy) {
        *stuck_for = std::chrono::duration_cast<common::Duration>(SteadyClock::now() - s_->started);
        return std::nullopt;
      }
      s_->busy = true;
      s_->started = SteadyClock::now();
      s_->job = [fn = std::move(fn), result = t.result] { *result = fn(); };
      t.seq = ++s_->submitted;
    }
    s_->cv.notify_all();
    return t;
  }

  // The started call's result, or nullopt when it is still running at `until`.
  template <typename T>
  std::optional<T> Await(const Ticket<T>& t, SteadyClock::time_point until) {
    std::unique_lock<std::mutex> lock(s_->mu);
    if (!s_->cv.wait_until(lock, until, [&] { return s_->finished >= t.seq; })) {
      return std::nullopt;
    }
    return std::move(*t.result);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> job;  // guarded by mu
    bool busy = false;          // a job is queued or running
    bool stopping = false;
    uint64_t submitted = 0, finished = 0;
    SteadyClock::time_point started;
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
      devices_caller_(std::make_unique<Caller>()),
      events_caller_(std::make_unique<Caller>()) {}

WatchedProbe::~WatchedProbe() = default;

WatchedProbe::Caller* WatchedProbe::CallerFor(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (callers_.size() <= index) callers_.resize(index + 1);
  if (!callers_[index]) callers_[index] = std::make_unique<Caller>();
  return callers_[index].get();
}

absl::StatusOr<std::vector<DeviceInfo>> WatchedProbe::Devices() {
  using Result = absl::StatusOr<std::vector<DeviceInfo>>;
  std::shared_ptr<GpuProbe> inner = inner_;
  common::Duration stuck_for{};
  auto ticket = devices_caller_->Start<Result>([inner] { return inner->Devices(); }, &stuck_for);
  std::optional<Result> r;
  if (ticket) r = devices_caller_->Await(*ticket, SteadyClock::now() + deadline_);
  if (r) return std::move(*r);
  if (ticket) hung_calls_++;
  return absl::UnavailableError(absl::StrCat("the ", backend_,
                                             " driver did not list its GPUs within ",
                                             common::ToMillis(deadline_), " ms"));
}

absl::StatusOr<GpuSample> WatchedProbe::Sample(uint32_t index) {
  return SampleAll({index}).front();
}

std::vector<absl::StatusOr<GpuSample>> WatchedProbe::SampleAll(
    const std::vector<uint32_t>& indexes) {
  using Result = absl::StatusOr<GpuSample>;
  struct Pending {
    Caller* caller = nullptr;
    std::optional<Caller::Ticket<Result>> ticket;
    common::Duration stuck_for{};
  };
  std::shared_ptr<GpuProbe> inner = inner_;
  std::vector<Pending> pending(indexes.size());
  for (size_t i = 0; i < indexes.size(); ++i) {
    const uint32_t index = indexes[i];
    if (index >= kMaxGpus) continue;
    pending[i].caller = CallerFor(index);
    pending[i].ticket = pending[i].caller->Start<Result>(
        [inner, index] { return inner->Sample(index); }, &pending[i].stuck_for);
  }
  // Every call started: one deadline for them all.
  const SteadyClock::time_point until = SteadyClock::now() + deadline_;
  std::vector<Result> out;
  out.reserve(indexes.size());
  for (size_t i = 0; i < indexes.size(); ++i) {
    Pending& p = pending[i];
    if (p.caller == nullptr) {
      out.push_back(absl::OutOfRangeError(absl::StrCat("GPU index ", indexes[i], " out of range")));
      continue;
    }
    std::optional<Result> r;
    if (p.ticket) r = p.caller->Await(*p.ticket, until);
    if (r) {
      out.push_back(std::move(*r));
      continue;
    }
    if (p.ticket) {  // this call missed the deadline
      hung_calls_++;
      p.stuck_for = deadline_;
    }
    GpuSample s;
    s.index = indexes[i];
    s.lost = true;
    s.stuck = true;
    s.lost_detail = absl::StrCat("the ", backend_, " driver has not answered for ",
                                 common::ToMillis(p.stuck_for), " ms (watchdog deadline ",
                                 common::ToMillis(deadline_), " ms)");
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<XidEvent>> WatchedProbe::WaitForXids(std::chrono::milliseconds timeout) {
  using Result = absl::StatusOr<std::vector<XidEvent>>;
  std::shared_ptr<GpuProbe> inner = inner_;
  common::Duration stuck_for{};
  auto ticket = events_caller_->Start<Result>(
      [inner, timeout] { return inner->WaitForXids(timeout); }, &stuck_for);
  std::optional<Result> r;
  if (ticket) r = events_caller_->Await(*ticket, SteadyClock::now() + timeout + deadline_);
  if (r) return std::move(*r);
  if (ticket) {
    hung_calls_++;
    stuck_for = timeout + deadline_;
  }
  return absl::UnavailableError(absl::StrCat("the ", backend_,
                                             " driver's event wait has not returned for ",
                                             common::ToMillis(stuck_for), " ms"));
}

std::optional<int> WatchedProbe::RecoveryAction(uint32_t index) {
  if (index >= kMaxGpus) return std::nullopt;
  std::shared_ptr<GpuProbe> inner = inner_;
  Caller* caller = CallerFor(index);
  common::Duration stuck_for{};
  auto ticket = caller->Start<std::optional<int>>(
      [inner, index] { return inner->RecoveryAction(index); }, &stuck_for);
  if (!ticket) return std::nullopt;  // the GPU's last call is still stuck
  std::optional<std::optional<int>> r = caller->Await(*ticket, SteadyClock::now() + deadline_);
  if (!r) {
    hung_calls_++;
    return std::nullopt;
  }
  return *r;
}

}  // namespace gpuha::gpu
