// RetryBudget: Finagle's retry budget, one per event loop. Every request
// deposits `percent`/100 of a retry, time deposits `min_per_second`, a retry
// withdraws one, and the balance is capped at `burst`. A node failing over
// all its in-flight requests at once is a burst the balance covers; a dying
// cluster is held to about `percent`% extra load.
//
//   RetryBudget budget({.percent = 20, .min_per_second = 10, .burst = 1000}, clock.Now());
//   budget.Deposit(now);                  // per request
//   if (!budget.TryWithdraw(now)) ...     // 503 retry_budget instead of a re-send
//
// Time comes in as an argument (the loop's coarse clock), so tests step it.
// Thread-safety: none; one loop owns each budget.
#pragma once

#include "common/clock.h"

namespace gpuha::router {

class RetryBudget {
 public:
  struct Options {
    double percent = 20;         // of a retry per request
    double min_per_second = 10;  // retries earned by time alone
    double burst = 1000;         // cap on the balance
  };
  // Starts with a second's worth of min_per_second (capped at burst).
  RetryBudget(Options o, common::TimePoint now);

  // A request arrived: it earns percent/100 of a retry.
  void Deposit(common::TimePoint now);
  // Takes one retry if the balance holds one.
  [[nodiscard]] bool TryWithdraw(common::TimePoint now);
  // The balance at `now`, including what time has earned.
  double Balance(common::TimePoint now);

 private:
  void Earn(common::TimePoint now);

  Options o_;
  double balance_ = 0;
  common::TimePoint last_;
};

}  // namespace gpuha::router
