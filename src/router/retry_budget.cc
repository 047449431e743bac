#include "router/retry_budget.h"

#include <algorithm>

namespace gpuha::router {

RetryBudget::RetryBudget(Options o, common::TimePoint now)
    : o_(o), balance_(std::min(o.burst, o.min_per_second)), last_(now) {}

void RetryBudget::Earn(common::TimePoint now) {
  if (now <= last_) return;
  double seconds = std::chrono::duration<double>(now - last_).count();
  balance_ = std::min(o_.burst, balance_ + o_.min_per_second * seconds);
  last_ = now;
}

void RetryBudget::Deposit(common::TimePoint now) {
  Earn(now);
  balance_ = std::min(o_.burst, balance_ + o_.percent / 100);
}

bool RetryBudget::TryWithdraw(common::TimePoint now) {
  Earn(now);
  if (balance_ < 1) return false;
  balance_ -= 1;
  return true;
}

double RetryBudget::Balance(common::TimePoint now) {
  Earn(now);
  return balance_;
}

}  // namespace gpuha::router
