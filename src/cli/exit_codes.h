// Exit codes shared by every subcommand.
#pragma once

namespace gpuha::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // I/O, missing GPU library, internal error
inline constexpr int kExitBadInput = 2;  // bad flags, config or input file
inline constexpr int kExitWarnings = 3;  // plan --strict and the plan has warnings
// worker --train: a later placement of the job holds its checkpoint
// directory; this one must not be restarted here.
inline constexpr int kExitFenced = 4;
// `gpuha worker --train` stopped by a signal before its last step, its
// progress checkpointed: not done, so whoever supervises it resumes it.
inline constexpr int kExitStoppedEarly = 5;

}  // namespace gpuha::cli
