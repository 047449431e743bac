// Loop: one event loop of the router and everything it owns. One thread
// runs each loop; its sockets, upstream pools, sticky table, retry budget
// and policy state are touched only from that thread (other threads post to
// it), so none of it is locked. What loops share (the published routes, the
// suspects for the controller) sits in RouterShared behind a mutex.
//
// Internal to the router: the units of the request path (client_conn,
// exchange) and router.cc include it; nothing else should.
#pragma once

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/intrusive/list.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/histogram.h"
#include "router/dns_cache.h"
#include "router/latency_histograms.h"
#include "router/progress.h"
#include "router/request.h"
#include "router/retry_budget.h"
#include "router/route_table.h"
#include "router/router_config.h"
#include "router/tenants.h"
#include "router/upstream_health.h"
#include "router/upstream_selector.h"

namespace gpuha::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;  // Asio timers; policy time comes from common::Clock
using common::TimePoint;
using std::chrono::milliseconds;

// Coroutines, sockets and timers on the io_context's own executor type rather
// than any_io_executor: no type-erased executor call per operation.
using Executor = net::io_context::executor_type;
template <class T>
using awaitable = net::awaitable<T, Executor>;
using Socket = net::basic_stream_socket<tcp, Executor>;
using Timer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;

struct Loop;

constexpr size_t kChunk = 64 * 1024;
constexpr size_t kMaxIdlePerUpstream = 256;

inline auto Redirect(error_code& ec) {
  return net::redirect_error(net::use_awaitable_t<Executor>(), ec);
}

// A coarse deadline on one socket. Arm() only stores a time; the loop's sweep
// (every kSweep) cancels the socket's pending operations once it has passed:
// never early, up to a sweep late.
// No timer per operation: no timerfd churn on the request path.
class Deadline {
 public:
  Deadline(Loop& loop, Socket& s);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;
  void Arm(milliseconds d);
  void Disarm() { at_ = Clock::time_point::max(); }
  bool expired() const { return expired_; }
  // Called by the sweep.
  void Check(Clock::time_point now) {
    if (now < at_) return;
    expired_ = true;
    at_ = Clock::time_point::max();
    error_code ec;
    s_.cancel(ec);
  }

 private:
  Loop& loop_;
  Socket& s_;
  Clock::time_point at_ = Clock::time_point::max();
  bool expired_ = false;
};

// What awaits an upstream's answer: an HTTP/1.1 connection awaiting its
// response head (or its next token), or an HTTP/2 call (router/h2_upstream.h).
// The hung and stall verdicts cancel it for the standby.
struct Waiting {
  virtual ~Waiting() = default;
  virtual void Cancel() = 0;  // sets hung_cancel and ends the wait
  // Bytes of its answer sit in the router's own socket buffer, unread: the
  // upstream has answered, whatever the router has not yet seen.
  virtual bool HasUnread() const { return false; }
  bool hung_cancel = false;   // cancelled because its upstream was judged hung or stalled
  TimePoint waiting_since{};  // when it began to await the response head (or the next token)
  common::Duration expect{};  // what its request declared it takes (0: nothing)
  // In its upstream's `waiting` list while it awaits an answer; leaves it by
  // itself when destroyed.
  boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>
      waiting_hook;
};

struct UpConn : Waiting {
  UpConn(Loop& loop, Executor ex) : s(ex), deadline(loop, s) {}
  void Cancel() override {
    hung_cancel = true;
    error_code ec;
    s.cancel(ec);
  }
  bool HasUnread() const override;
  // Writing to its client (a token stream): bytes left unread on `s` then
  // are the client's slowness, not the router's.
  bool client_paused = false;
  Socket s;
  Deadline deadline;
  beast::flat_buffer buf;
  // In its upstream's pool: closed, not reused, from idle_until on (the
  // upstream closes idle connections itself; limits.upstream_idle_timeout).
  Clock::time_point idle_until{};
  // TLS over `s` when upstream_tls is configured (declared last: destroyed
  // before the socket it runs on).
  std::shared_ptr<ssl::context> tls_ctx;
  std::unique_ptr<ssl::stream<Socket&>> tls;

  // I/O on whichever of the two carries the connection. Plain functions that
  // hand back the operation's awaitable: no coroutine frame of their own.
  template <class Buffers>
  awaitable<size_t> Write(const Buffers& b, error_code& ec) {
    return tls ? net::async_write(*tls, b, Redirect(ec)) : net::async_write(s, b, Redirect(ec));
  }
  template <class Token>
  auto async_read_some(const net::mutable_buffer& b, Token&& token) {
    return tls ? tls->async_read_some(b, std::forward<Token>(token))
               : s.async_read_some(b, std::forward<Token>(token));
  }
};
using WaitingList = boost::intrusive::list<
    Waiting,
    boost::intrusive::member_hook<Waiting, decltype(Waiting::waiting_hook), &Waiting::waiting_hook>,
    boost::intrusive::constant_time_size<false>>;

class H2UpConn;
struct UpstreamState;
namespace grpc_proxy {
struct H2ClientConn;
}
// The upstream's pooled HTTP/2 connections closed (router/h2_upstream.h).
void DropH2(UpstreamState& up);

// One upstream as one loop sees it: its policy state (UpstreamHealth) and
// its connections. Loop-local: no locks.
struct UpstreamState : UpstreamHealth {
  UpstreamState(UpstreamHealth::Options ejection, ProgressOptions progress_options)
      : UpstreamHealth(ejection),
        progress(progress_options),
        first_token(progress_options),
        tokens(progress_options) {}
  ProgressMonitor progress;  // answers and their latencies, for the stall verdict
  // Token streams (SSE): the time to first token, and the gap between
  // tokens, learned per upstream; a stream silent past them is stalled by
  // the same rule as a request awaiting its head.
  ProgressMonitor first_token;
  ProgressMonitor tokens;
  int consecutive_5xx = 0;  // answers of 5xx in a row
  // Answered 400 to a request the router had added return_token_ids to:
  // its LLM requests go as the client sent them (SseContinuity).
  bool refuses_token_ids = false;
  // Judged stalled (by this loop or another), and no progress seen since:
  // JudgeProgress then needs one overdue request, not min_waiting, and
  // cancels requests that wait on it past their limit while it is ejected.
  bool judged_stalled = false;
  // The prober found it hung (its probe unanswered past hang_after) while
  // this loop still saw its requests answered within hang_after: a server
  // busy enough to answer its probe late, not a hung one (issue 37: an
  // overloaded standby taking a failover's re-sends was judged hung, and
  // every request on it failed). Held until its requests go quiet too
  // (ApplyHeldHangs), or the prober's next verdict replaces it.
  bool hang_held = false;
  std::string address;
  std::string node;
  tcp::endpoint endpoint;
  // A DNS name (not an IP): its endpoint comes from the shared DnsCache,
  // looked up again whenever the cache's generation moves.
  bool named = false;
  uint64_t dns_generation = 0;
  std::vector<std::unique_ptr<UpConn>> idle;
  // gRPC: the upstream's HTTP/2 port (the route's grpc address) and its
  // pooled connections (router/h2_upstream.h).
  std::string grpc_address;
  tcp::endpoint grpc_endpoint;
  std::vector<std::shared_ptr<H2UpConn>> h2;
  WaitingList waiting;  // awaiting a response head (no allocation per request)
  // Relaying a token stream: waiting_since is the stream's last token (or
  // its head), expect the first-token window until the first one.
  WaitingList streaming;
};

// Every plain counter of a loop, declared once: the list makes both the
// fields and their /metrics families (gpuha_router_<field>_total).
#define GPUHA_ROUTER_COUNTERS(X)                                                                  \
  X(requests, "Requests read from clients.")                                                      \
  X(retries, "Requests re-sent to another upstream.")                                             \
  X(hung_resends, "Requests re-sent because their upstream was judged hung.")                     \
  X(stale_resends, "Requests re-sent on a fresh connection after a pooled one was closed.")       \
  X(ejections, "Upstreams ejected after a connection failure.")                                   \
  X(upstream_connects, "New upstream connections.")                                               \
  X(upstream_reuses, "Requests sent on a pooled connection.")                                     \
  X(upstream_conns_unclean,                                                                       \
    "Pooled upstream connections closed, not reused: bytes or EOF came after their answer.")      \
  X(client_aborts, "Clients that left before their answer.")                                      \
  X(upstream_aborts, "Responses cut because the upstream broke mid-body.")                        \
  X(connections, "Client connections accepted.")                                                  \
  X(accept_pauses, "Pauses of accepting while out of file descriptors (EMFILE, ENFILE).")         \
  X(stalls, "Upstreams judged stalled: requests waiting, none answered (progress).")              \
  X(stall_resends, "Requests re-sent because their upstream was judged stalled.")                 \
  X(held_hangs, "Prober hang verdicts held because the upstream's requests were still answered.") \
  X(ejections_5xx, "Upstreams ejected after consecutive 5xx answers.")                            \
  X(retries_5xx, "Requests re-sent to the standby after a 500, 502, 503 or 504.")                 \
  X(tls_handshake_failures, "Failed TLS handshakes.")                                             \
  X(sse_streams, "LLM token streams (SSE on an llm route) relayed.")                              \
  X(sse_tokens, "Tokens relayed on LLM token streams (chunks with text).")                        \
  X(sse_continuations, "Token streams continued on the standby mid-answer.")                      \
  X(sse_token_id_continuations, "Of those, continued on their token IDs (the rest by text).")     \
  X(sse_error_events, "Token streams ended with an SSE error event: the rest could not be had.")  \
  X(token_stalls, "Upstreams judged stalled mid-answer: token streams silent past their gap.")    \
  X(h2_connections, "HTTP/2 client connections (h2c prior knowledge, or h2 by TLS ALPN).")        \
  X(grpc_calls, "gRPC calls read from HTTP/2 clients.")                                           \
  X(grpc_streams, "gRPC streaming calls (ModelStreamInfer) from HTTP/2 clients.")                 \
  X(grpc_stream_continuations,                                                                    \
    "gRPC streams continued on the standby, unanswered messages re-sent.")                        \
  X(h2_resets, "RST_STREAM frames received from HTTP/2 clients.")                                 \
  X(h2_protocol_errors, "HTTP/2 client connections ended for a protocol error or a limit.")

struct Stats {
#define GPUHA_FIELD(name, help) std::atomic<uint64_t> name{0};
  GPUHA_ROUTER_COUNTERS(GPUHA_FIELD)
#undef GPUHA_FIELD
  std::array<std::atomic<uint64_t>, 6> upstream_class{};  // 1xx..5xx from upstreams
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Reason::kCount)> router_answers{};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> open_connections{0};  // client connections, HTTP/1.1 and HTTP/2
};

inline void Inc(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

// A request (or call) counted in Stats::in_flight for as long as it lives.
class InFlight {
 public:
  explicit InFlight(std::atomic<int64_t>& n) : n_(n) { n_.fetch_add(1, std::memory_order_relaxed); }
  ~InFlight() { n_.fetch_sub(1, std::memory_order_relaxed); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int64_t>& n_;
};

// What failovers cost, per loop, merged at scrape: upstream attempts per
// request (1: no failover), how long a request that needed more than one
// upstream took in all, and how long an upstream had made no progress when
// it was judged stalled. The loop writes, a scrape reads:
// each call takes the mutex, uncontended but while a scrape copies.
struct RequestHistograms {
  static std::vector<double> Attempts() { return {1, 2, 3, 4, 8}; }
  static std::vector<double> Seconds() {
    return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  }
  void Request(int attempts, common::Duration took) {
    std::lock_guard<std::mutex> lock(mu);
    upstream_attempts.Observe(attempts);
    if (attempts > 1) failover_seconds.Observe(std::chrono::duration<double>(took).count());
  }
  void Stall(common::Duration without_progress) {
    std::lock_guard<std::mutex> lock(mu);
    stall_detection_seconds.Observe(std::chrono::duration<double>(without_progress).count());
  }
  mutable std::mutex mu;
  common::Histogram upstream_attempts{Attempts()};
  common::Histogram failover_seconds{Seconds()};
  common::Histogram stall_detection_seconds{Seconds()};
};

constexpr milliseconds kSweep{20};

// What every loop and the router's control thread share.
struct RouterShared {
  mutable std::mutex mu;
  std::shared_ptr<const RouteTable> routes;  // guarded by mu
  std::atomic<uint64_t> routes_gen{0};       // bumped after each new table
  std::mutex suspects_mu;
  std::vector<std::string> suspects;  // guarded by suspects_mu; hints for the controller
  // A loop that judged an upstream stalled hands the verdict to the others
  // (set once, before the loops run): each loop sees only its own requests.
  std::function<void(const std::string& address, const Loop* from)> on_stall;
  // Upstreams given by name (set once, before the loops run).
  const DnsCache* dns = nullptr;
  // Router::Drain began: answers carry Connection: close, no connection is
  // kept for another request.
  std::atomic<bool> draining{false};
  // The drain's timeout passed with requests open: each answer still
  // awaited from an upstream ends with a clear error (an SSE error event, a
  // 503 draining), not a silent cut.
  std::atomic<bool> drain_expired{false};
};

struct Loop {
  // One thread runs this io_context and every socket on it is touched only
  // from that thread (other threads post to it), so the reactor's
  // per-socket locking is off.
  Loop(common::Clock& c, const RouterConfig& config, RouterShared& shared)
      : ioc_owner(std::make_unique<net::io_context>(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO)),
        ioc(*ioc_owner),
        config(config),
        shared(shared),
        clock(c),
        now(c.Now()),
        sticky(config.sticky),
        retry_budget({.percent = config.retry_budget_percent,
                      .min_per_second = config.retry_min_per_second,
                      .burst = config.retry_burst},
                     now),
        ejection({.base = config.ejection_base, .max = config.ejection_max}) {}
  ~Loop() {
    // Pooled sockets first, while the io_context lives; then the io_context,
    // whose destruction frees suspended request frames, which still touch
    // the members below.
    acceptor.reset();
    for (auto& [address, up] : upstreams) {
      up->idle.clear();
      DropH2(*up);  // closed now: a call's frame that goes later resets nothing
    }
    ioc_owner.reset();
  }
  std::unique_ptr<net::io_context> ioc_owner;
  net::io_context& ioc;
  // The settings a reload cannot change (limits, timeouts, failover); what
  // it can (certificates, tenants) is copied into the loop below.
  const RouterConfig& config;
  RouterShared& shared;
  common::Clock& clock;
  TimePoint now;  // clock.Now() as of the last sweep, for policy: coarse, and free to read
  // When the next stall verdict falls due, if one is pending (JudgeProgress):
  // the sweep wakes then rather than up to kSweep later.
  std::optional<TimePoint> next_verdict;
  // How late this loop's sweeps have woken lately (decaying peak): the
  // host's own lag. A progress verdict waits this much longer, twice over:
  // a loaded machine delays the answers it judges, and a verdict that the
  // load alone can cause is not one.
  common::Duration lag{};
  // Socket deadlines run on the steady clock, whatever `clock` is (a test's
  // fake clock must not freeze I/O timeouts); as of the last sweep.
  Clock::time_point io_now = Clock::now();
  std::unordered_set<Deadline*> deadlines;
  // HTTP/1.1 client connections waiting for their next request (their
  // deadlines): a drain closes them once nothing is in flight.
  std::unordered_set<Deadline*> idle_clients;
  // HTTP/2 client connections, which a drain sends GOAWAY.
  std::unordered_set<grpc_proxy::H2ClientConn*> h2_clients;
  std::vector<std::unique_ptr<char[]>> free_chunks;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::thread thread;
  std::unordered_map<std::string, std::unique_ptr<UpstreamState>> upstreams;
  StickyTable sticky;
  std::shared_ptr<const RouteTable> routes;
  uint64_t routes_gen = ~uint64_t{0};
  std::shared_ptr<const TenantSet> tenants;
  std::shared_ptr<ssl::context> tls;           // null: plain HTTP
  std::shared_ptr<ssl::context> upstream_tls;  // null: plain HTTP to upstreams
  RetryBudget retry_budget;
  UpstreamHealth::Options ejection;
  // The prober's verdicts other than up, kept even for upstreams this loop
  // has not used yet: one created later starts with its verdict (a verdict
  // that came first was once lost, and a down upstream taken for up).
  std::unordered_map<std::string, Health> verdicts;
  bool accept_paused = false;  // out of descriptors: accepts wait kAcceptPause
  Stats stats;
  LatencyHistograms latency;
  RequestHistograms requests;
};

inline Deadline::Deadline(Loop& loop, Socket& s) : loop_(loop), s_(s) {
  loop_.deadlines.insert(this);
}
inline Deadline::~Deadline() { loop_.deadlines.erase(this); }
inline void Deadline::Arm(milliseconds d) {
  // From the clock now, not the sweep's io_now: that one is up to a sweep
  // old (more on a loaded host), and a deadline counted from it fell due
  // early (a 400 ms body_timeout once closed a connection after 388 ms).
  at_ = Clock::now() + d;
  expired_ = false;
}

// A 64 KiB relay buffer from the loop's free list; returned on destruction.
class Chunk {
 public:
  explicit Chunk(Loop& loop) : loop_(loop) {
    if (loop.free_chunks.empty()) {
      p_.reset(new char[kChunk]);  // not value-initialised: no memset per request
    } else {
      p_ = std::move(loop.free_chunks.back());
      loop.free_chunks.pop_back();
    }
  }
  ~Chunk() {
    if (loop_.free_chunks.size() < 64) loop_.free_chunks.push_back(std::move(p_));
  }
  char* get() const { return p_.get(); }

 private:
  Loop& loop_;
  std::unique_ptr<char[]> p_;
};

// Parsing happens in place: bytes are read into a flat buffer and fed to the
// parser here, skipping Beast's composed read operations, each of which costs
// a trip through the scheduler even when the bytes are already buffered (a
// small keep-alive request and its response usually arrive whole).
constexpr size_t kReadAhead = 16 * 1024;

// Feeds `p` from `buf`. True when that moved the parser (bytes parsed,
// completion, a full body buffer or an error): no read is needed yet.
template <class Parser>
bool ParseBuffered(beast::flat_buffer& buf, Parser& p, error_code& ec) {
  if (buf.size() == 0) return false;
  size_t n = p.put(buf.data(), ec);
  buf.consume(n);
  if (ec == http::error::need_more) ec = {};
  if (ec == http::error::need_buffer) {  // the body buffer is full
    ec = {};
    return true;
  }
  return ec || n > 0 || p.is_done();
}

// Settles a read of `got` bytes into `buf` that ended with `ec`: the bytes are
// committed, or an end of stream becomes what the parser makes of it. True
// when the peer ended the stream.
template <class Parser>
bool AfterRead(beast::flat_buffer& buf, Parser& p, size_t got, error_code& ec) {
  // A TLS peer that closes without close_notify has ended the stream too.
  if (ec == net::error::eof || ec == ssl::error::stream_truncated) {
    ec = {};
    if (!p.got_some()) {
      ec = http::error::end_of_stream;  // closed between messages
    } else {
      p.put_eof(ec);  // completes a body delimited by close, else partial_message
    }
    return true;
  }
  if (!ec) buf.commit(got);
  return false;
}

// Feeds `p` from `buf`, reading the socket only when the buffered bytes do
// not let the parser advance, and returns after any progress, completion or
// an error. The two heads on every request's path inline this loop instead:
// a coroutine call costs a frame allocation.
template <class Stream, class Parser>
awaitable<void> ReadSome(Stream& s, beast::flat_buffer& buf, Parser& p, error_code& ec) {
  for (;;) {
    if (ParseBuffered(buf, p, ec)) co_return;
    size_t got = co_await s.async_read_some(buf.prepare(kReadAhead), Redirect(ec));
    if (AfterRead(buf, p, got, ec) || ec) co_return;
  }
}

// Whether a re-send to the next upstream may go. A verdict's re-send (the
// request was cancelled because its upstream was judged hung or stalled)
// is failover: it is bounded by what was waiting on that upstream and goes
// to a standby, so it is not rationed (rationed, a stall at 1,000 req/s
// lost every waiting request the balance could not pay for, issue 37).
// Any other re-send is paid for from the loop's retry budget.
inline bool MayResend(Loop& L, bool verdict) {
  return verdict || L.retry_budget.TryWithdraw(L.now);
}

// Runs the loop's coarse clock and its deadlines (every kSweep).
awaitable<void> Sweep(Loop& L);

// Takes the newest published route table, if it changed.
void RefreshRoutes(Loop& L);
// The loop's state for upstream `u`, made on first use.
UpstreamState& FindUpstream(Loop& L, const Upstream& u);
// A named upstream's endpoint from the DnsCache (resolvable false while the
// name does not resolve); a moved address drops the pooled connections.
void LookUpName(Loop& L, UpstreamState& up);
// Whether a connection may go back to its upstream's pool: it is still to
// the upstream's address (a named upstream may have moved while it was in
// use), and the upstream is up.
bool Poolable(const UpConn& c, const UpstreamState& up);
// A connection whose answer `res` is done goes back to the pool (if
// Poolable), to be closed once idle for limits.upstream_idle_timeout, or
// for less when the answer's Keep-Alive: timeout=N says the upstream keeps
// it for less (N less a second).
void PoolIdle(Loop& L, UpstreamState& up, std::unique_ptr<UpConn> c,
              const http::response_header<Fields>& res);
// The newest pooled connection not yet idle too long (older ones are
// closed); null when none.
std::unique_ptr<UpConn> TakeIdle(Loop& L, UpstreamState& up);
// Pooled connections idle too long, closed (run by the sweep).
void TrimIdle(Loop& L);
// An upstream's answer, waited for `waited`, arrived `at`. A server error
// (5xx; gRPC's UNAVAILABLE, INTERNAL, UNKNOWN, DATA_LOSS) is not progress
// for the stall verdict (a stuck server at capacity that answers 503 at once
// is still stuck) and counts toward consecutive-5xx ejection; any other
// answer is progress and ends the run of errors. No `waited` (a stream's
// end, which says nothing of how long a request takes): progress, with no
// latency learned.
void UpstreamAnswered(Loop& L, UpstreamState& up, bool server_error, TimePoint at,
                      std::optional<common::Duration> waited);
// A connection-level failure: outlier ejection, the pool dropped, and the
// node reported to the controller as a suspect.
void ConnectionFailed(Loop& L, UpstreamState& up);
// The stall verdict (ProgressMonitor) on every upstream with requests
// waiting: a stalled one has its waiting requests cancelled for their
// standbys and is ejected, with a suspect hint for the controller. Run by
// the sweep.
void JudgeProgress(Loop& L);
// A sweep woke `late` past its time, `since_last` after the one before:
// folded into L.lag.
void NoteLag(Loop& L, common::Duration late, common::Duration since_last);
// Another loop's stall verdict: this loop's waiting requests on `address`
// go to their standbys and the upstream is ejected here too, unless this
// loop saw it progress within a window; it is then only marked
// judged_stalled, and one overdue request of this loop's is enough.
void StallVerdict(Loop& L, const std::string& address);
// The prober's verdict on `address`. Down or hung: requests waiting on it
// for a response head are re-sent to their standby now. A hung verdict on
// an upstream this loop saw answer (progress) within hang_after is held:
// the data plane is the better witness of a busy server.
void SetHealth(Loop& L, const std::string& address, Health h);
// Held hang verdicts (UpstreamState::hang_held) whose upstream has now gone
// hang_after without progress are applied. Run by the sweep.
void ApplyHeldHangs(Loop& L);

}  // namespace gpuha::router
