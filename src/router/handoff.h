// Listener handoff: a running router gives its listening sockets to the
// router that replaces it (a restart, a binary upgrade), as HAProxy hands
// its listeners to a new worker (`expose-fd listeners`) and Envoy's hot
// restart does. The sockets never close, so no connection is refused: the
// kernel keeps queueing on them while the new process starts accepting and
// the old one drains what it holds (Router::Drain).
//
//   // The new process, before it would bind:
//   absl::StatusOr<Listeners> got = TakeListeners(path);  // NotFound: none runs
//   // The running one, once it listens:
//   auto server = HandoffServer::Start(path, std::move(dups), [&] { taken = true; });
//
// The handoff socket is a Unix stream socket of mode 0600 at `path`: only
// its owner (the router's user, or root) can take the listeners, so another
// process cannot share the port unseen. The exchange: the taker writes
// "take 1\n"; the giver answers "listeners N\n" with N + 1 descriptors in
// one SCM_RIGHTS message, the data-plane listeners then the admin one; the
// taker writes "ready\n" once it serves (it holds routes). Only then does
// the giver count its listeners taken and drain: a taker that fails before
// (a bad config, no routes) leaves the giver serving, its listeners its own
// still, and free to give them to the next taker.
//
// Thread-safety: a HandoffServer serves on a thread of its own and gives
// its listeners once; `on_taken` runs on that thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::router {

// Listening TCP sockets; the holder closes them.
struct Listeners {
  std::vector<int> data;  // the data plane's, one per loop of the giver
  int admin = -1;
  int giver = -1;  // the taker's connection to the giver, for SayReady
  void Close();
};

// Tells the giver the taker serves now (it drains), and closes `*giver`.
void SayReady(int* giver);

// The listeners of the router serving at `path`. NotFound when none does
// (no socket there, or a stale one nobody listens on: a first start, or
// after a crash). Any other error names what went wrong.
[[nodiscard]] absl::StatusOr<Listeners> TakeListeners(const std::string& path);

class HandoffServer {
 public:
  // Serves `fds` (which it owns from now on) at `path`, replacing a socket
  // file left there (the router these listeners were taken from).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HandoffServer>> Start(
      const std::string& path, Listeners fds, std::function<void()> on_taken);
  // Stops serving, closes what it holds, and removes `path` if it is still
  // its own socket (a successor's is left alone).
  ~HandoffServer();
  HandoffServer(const HandoffServer&) = delete;
  HandoffServer& operator=(const HandoffServer&) = delete;

 private:
  HandoffServer() = default;
  void Serve();

  std::string path_;
  Listeners fds_;
  std::function<void()> on_taken_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  // Waits for the taker's "ready" on `c`; false: it ended or stopping.
  bool AwaitReady(int c);
  unsigned long inode_ = 0;
  std::thread thread_;
};

}  // namespace gpuha::router
