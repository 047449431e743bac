// A streaming gRPC call (ModelStreamInfer) through the router: relayed
// message by message, and continued on the standby when its upstream
// fails.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <deque>

#include "common/log.h"
#include "router/grpc_call.h"

namespace gpuha::router::grpc_proxy {
namespace {

// The length-prefixed messages of a gRPC body: the first whole one in `b`
// from `at` (its 5-byte prefix included), or 0 bytes while it is not whole.
size_t WholeMessage(std::string_view b) {
  if (b.size() < 5) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const size_t n = (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4];
  return b.size() >= 5 + n ? 5 + n : 0;
}

// Messages of one stream asked of its upstream at once; the rest wait in
// the client's window.
constexpr size_t kMaxUnanswered = 128;

}  // namespace

// A streaming call (ModelStreamInfer, not decoupled): each request message
// is held until its answer comes back (answers come one per request, in
// order). When the upstream fails, the call is opened on the standby and
// the unanswered messages are sent again in order: the client's stream goes
// on, and every request gets exactly one answer. A message's bytes go back
// to the client's flow-control window when it is answered, so a client
// that pipelines into a stuck upstream is held by its window. An upstream
// that answers more messages than it was sent is a decoupled model: its
// stream cannot be continued, and a failure ends it with UNAVAILABLE that
// says so.
awaitable<void> HandleStream(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id) {
  const RouterConfig& config = L.config;
  CallCount count{*conn};
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.requests);
  Inc(L.stats.grpc_calls);
  Inc(L.stats.grpc_streams);
  CallCtx c(L, conn, id);
  c.request = s->headers;  // its body keeps coming
  if (!Admit(c)) co_return;
  c.streamed = true;
  InFlight in_flight(L.stats.in_flight);
  conn->h2.StartStreaming(id);
  const size_t max_message = LimitsOf(config).max_request_bytes;
  std::deque<std::string> unanswered;           // sent upstream, no answer yet (oldest first)
  std::deque<Clock::time_point> sent_at;        // when each was (last) sent
  Clock::time_point last_answer{};              // the last answer of this stream
  Clock::time_point last_heard = Clock::now();  // the client's last bytes
  size_t heard = 0;                             // bytes of its body not yet taken, at the last look
  bool decoupled = false;
  bool client_done = false;
  bool hung = false, unavailable = false;
  // Attempts are counted apart from the place in the order: a stream that
  // lived on an upstream until it failed takes its upstreams anew.
  size_t attempt = 0;
  for (size_t i = 0; i < c.order.size(); ++i, ++attempt) {
    UpstreamState& up = *c.order[i];
    if (!c.MayRetry(attempt, hung, unavailable)) co_return;
    hung = unavailable = false;
    if (!c.ServesGrpc(up)) continue;
    if (c.DeadlinePassed()) break;
    if (attempt > 0 && decoupled) {
      c.Answer(Reason::kUpstreamFailed,
               absl::StrCat("the model is decoupled (its answers are not one per request), so "
                            "its stream cannot be continued on the standby; the stream broke: ",
                            c.last_failure));
      co_return;
    }
    c.attempts = static_cast<int>(attempt + 1);
    // The upstream stream's body: the unanswered messages, then the next
    // (declared before the call, whose reads point into it).
    std::string out;
    for (const std::string& m : unanswered) out += m;
    H2Call call(L);
    call.streaming = true;
    call.body_done = false;
    call.body = &out;
    ClientHook hook(*conn, id, call);
    if (H2Stream* cs = conn->h2.Find(id)) {
      cs->on_data = [&call] { call.wake.cancel(); };
    }
    struct Unhook {
      H2ClientConn& c;
      int32_t id;
      ~Unhook() {
        if (H2Stream* s = c.h2.Find(id)) s->on_data = nullptr;
      }
    } unhook{*conn, id};
    up.in_flight++;
    struct Dec {
      int64_t* v;
      ~Dec() { --*v; }
    } dec{&up.in_flight};
    const bool started = co_await H2Start(L, up, c.UpstreamHeaders(up), call);
    if (call.client_gone || conn->closed) {
      Inc(L.stats.client_aborts);
      co_return;
    }
    if (!started) {
      c.last_failure = absl::StrCat(up.node, ": ", call.why);
      continue;
    }
    std::fill(sent_at.begin(), sent_at.end(), Clock::now());  // sent again now
    size_t parsed = 0;           // of call.data: answers relayed so far
    bool answered_here = false;  // this upstream answered one of this stream's messages
    bool error_answer = false;   // it answered one with an error (StreamAnswerIsError)
    // Whether a break here can go on elsewhere: to the next upstream, or
    // (a stream that lived here) to where its route points now.
    // (A decoupled model's stream is not continued; the next attempt says so.)
    auto can_continue = [&] { return i + 1 < c.order.size() || (answered_here && !decoupled); };
    bool check_overdue = false;
    error_code ec;
    for (;;) {
      // The client's new whole messages go upstream, and are held.
      H2Stream* cs = conn->h2.Find(id);
      if (cs == nullptr) {
        Inc(L.stats.client_aborts);
        co_return;  // the client left
      }
      size_t took = 0;
      std::string_view b(cs->body);
      // A client that does not read its answers gets no more of its
      // messages taken (nor its window back) until it does, and no more
      // than kMaxUnanswered are asked at once: the answers the router holds
      // for it stay bounded (1 MiB unsent, plus the answers in flight).
      const bool backlogged = conn->h2.AnswerBacklogged(id);
      for (; !backlogged && unanswered.size() < kMaxUnanswered;) {
        std::string_view rest = b.substr(took);
        if (rest.size() >= 5) {
          const auto* p = reinterpret_cast<const unsigned char*>(rest.data());
          const size_t len =
              (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4];
          if (len + 5 > max_message) {
            c.Answer(Reason::kBodyTooLarge,
                     absl::StrCat("a stream message over ", max_message, " bytes"));
            co_return;
          }
        }
        size_t n = WholeMessage(rest);
        if (n == 0) break;
        unanswered.emplace_back(rest.substr(0, n));
        sent_at.push_back(Clock::now());
        if (call.body_sent > 64 * 1024) {  // keep the upstream body from growing
          out.erase(0, call.body_sent);
          call.body_sent = 0;
        }
        out += unanswered.back();
        took += n;
      }
      if (took > 0) {
        conn->h2.Consume(id, took);
        H2Resume(call);
      }
      if (took > 0 || cs->body.size() != heard) last_heard = Clock::now();
      heard = cs->body.size();
      if (cs->complete && !client_done) {
        // Whole messages held back (128 asked, or a client behind on its
        // answers) are taken later; a part of one is a broken end.
        if (!cs->body.empty() && WholeMessage(cs->body) == 0) {
          c.Answer(Reason::kBadRequest, "the stream ended inside a message");
          co_return;
        }
        client_done = cs->body.empty();
      }
      if (client_done && !call.body_done) {
        call.body_done = true;
        H2Resume(call);
      }
      // The upstream's whole answers go to the client, each retiring the
      // oldest unanswered request (whose bytes go back to the window).
      std::string_view d(call.data);
      while (size_t n = WholeMessage(d.substr(parsed))) {
        // An error answer while another upstream is left and the retry
        // budget pays for it: this one may be failing (a CUDA error, an
        // engine gone bad), and the stream goes on there with this message
        // unanswered, as an HTTP 500 is re-sent. From the last upstream the
        // error is relayed: the stream lives on.
        if (!unanswered.empty() && config.retry_5xx && i + 1 < c.order.size() && !decoupled &&
            L.retry_budget.Balance(L.now) >= 1 && StreamAnswerIsError(d.substr(parsed, n))) {
          error_answer = true;
          break;
        }
        if (!c.began) {
          conn->h2.RespondStreaming(id, RelayHeaders(call.headers));
          c.began = true;
        }
        conn->h2.SendData(id, d.substr(parsed, n));
        parsed += n;
        // A decoupled model answers without being asked: a client that
        // reads none of it would have the router hold it all.
        if (H2Stream* held = conn->h2.Find(id);
            held != nullptr && held->unsent() > LimitsOf(config).max_buffered_bytes) {
          c.Answer(Reason::kBodyTooLarge,
                   absl::StrCat("the client left over ", LimitsOf(config).max_buffered_bytes,
                                " bytes of its answers unread"));
          co_return;
        }
        last_answer = Clock::now();
        if (unanswered.empty()) {
          decoupled = true;  // more answers than requests
        } else {
          UpstreamAnswered(
              L, up, false, L.clock.Now(),
              std::chrono::duration_cast<common::Duration>(last_answer - sent_at.front()));
          conn->h2.Release(id, unanswered.front().size());
          unanswered.pop_front();
          sent_at.pop_front();
          answered_here = true;
        }
        conn->Kick();
      }
      if (parsed > 64 * 1024) {
        call.data.erase(0, parsed);
        parsed = 0;
      }
      // Owed since the later of its sending and the last answer: answers
      // come in order, so one queued behind another is not late.
      const Clock::time_point owed_since =
          unanswered.empty() ? Clock::time_point() : std::max(sent_at.front(), last_answer);
      // Watched by the hung and stall verdicts while an answer is owed.
      if (unanswered.empty()) {
        call.waiting_hook.unlink();
      } else {
        call.waiting_since =
            L.clock.Now() - std::chrono::duration_cast<common::Duration>(Clock::now() - owed_since);
        call.expect = {};
        if (!call.waiting_hook.is_linked()) up.waiting.push_back(call);
      }
      if (call.client_gone || conn->closed) {
        Inc(L.stats.client_aborts);
        co_return;
      }
      // A drain (Router::Drain) ends the stream at its first quiet moment:
      // no answer owed, no message begun. The client opens its next call on
      // another connection (the GOAWAY sent it elsewhere: the router that
      // took the listeners, or the next one), and no message is cut, as
      // the drain's timeout would cut one.
      if (L.shared.draining.load(std::memory_order_relaxed) && unanswered.empty() && heard == 0 &&
          !decoupled) {
        c.Answer(Reason::kDraining,
                 "the router is draining (a restart or a stop): open the stream again");
        co_return;
      }
      if (call.done || call.hung_cancel || error_answer) break;
      // An answer owed past response_timeout: the upstream is taken for
      // stuck, as a unary call's would be. Judged after the events already
      // queued are taken in (the timer may fire beside them).
      const Clock::time_point overdue_at = unanswered.empty()
                                               ? Clock::time_point::max()
                                               : owed_since + config.limits.response_timeout;
      // Nothing owed, and neither side has said anything for idle_timeout
      // (Envoy's stream idle timeout), or body_timeout inside a message:
      // the stream ends, since the connection's read deadline leaves a
      // call being worked on alone.
      const bool mid_message = heard > 0 && !backlogged;
      const milliseconds idle_for =
          mid_message || backlogged ? config.limits.body_timeout : config.limits.idle_timeout;
      const Clock::time_point idle_at = unanswered.empty()
                                            ? std::max(last_heard, last_answer) + idle_for
                                            : Clock::time_point::max();
      if (check_overdue && Clock::now() >= idle_at) {
        c.Answer(Reason::kStreamIdle,
                 backlogged ? absl::StrCat("the client read none of its answers for body_timeout (",
                                           idle_for.count(), " ms)")
                 : mid_message
                     ? absl::StrCat("the client stopped inside a message for body_timeout (",
                                    idle_for.count(), " ms)")
                     : absl::StrCat("the stream was idle for idle_timeout (", idle_for.count(),
                                    " ms): no message from the client, no answer owed"));
        co_return;
      }
      if (check_overdue && Clock::now() >= std::min(overdue_at, c.deadline)) {
        call.timed_out = true;
        break;
      }
      check_overdue = false;
      // Answers made room, or the client read its backlog: the messages
      // held back are taken now, not at the next event.
      if (H2Stream* held = conn->h2.Find(id);
          held != nullptr && unanswered.size() < kMaxUnanswered && !conn->h2.AnswerBacklogged(id) &&
          WholeMessage(held->body) > 0) {
        continue;
      }
      call.wake.expires_at(std::min({overdue_at, idle_at, c.deadline}));
      co_await call.wake.async_wait(Redirect(ec));
      if (!ec) check_overdue = true;  // the timer ran out: take in what came, then judge
    }
    call.waiting_hook.unlink();
    if (call.response_too_large) {
      c.Answer(Reason::kBodyTooLarge, absl::StrCat(up.node, ": ", call.why));
      co_return;
    }
    const std::string_view grpc_status = GrpcStatusOf(call);
    const bool retryable_status = RetryableStatus(grpc_status);
    if (!error_answer && call.done && !call.failed && H2Find(call.headers, ":status") == "200" &&
        !grpc_status.empty() && !(retryable_status && config.retry_5xx && can_continue()) &&
        (grpc_status != "0" || (unanswered.empty() && client_done))) {
      // Ended: whole, or with the upstream's own status, which is relayed.
      if (ServerError(grpc_status)) UpstreamAnswered(L, up, true, call.answered_at, std::nullopt);
      if (!c.began) {
        conn->h2.Respond(id, RelayHeaders(call.headers), "", EndingTrailers(call));
      } else {
        conn->h2.Finish(id, EndingTrailers(call));
      }
      conn->Kick();
      co_return;
    }
    // The stream broke with answers owed, ended early, or ended UNAVAILABLE.
    c.last_failure = absl::StrCat(
        up.node, ": ",
        error_answer           ? std::string("answered a message with an error")
        : call.hung_cancel     ? std::string("hung")
        : call.timed_out       ? (c.DeadlinePassed() ? std::string("grpc-timeout passed")
                                                     : std::string("an answer overdue"))
        : call.failed          ? call.why
        : !grpc_status.empty() ? absl::StrCat("grpc-status ", std::string(grpc_status), " ",
                                              std::string(H2Find(call.trailers, "grpc-message")),
                                              std::string(H2Find(call.headers, "grpc-message")))
                               : std::string("the stream ended without a status"));
    hung = call.hung_cancel;
    unavailable = retryable_status || error_answer;
    // An error answer is not held against the upstream (its ejection):
    // error_message cannot say whether the server or the request was bad,
    // and one tenant's bad frames must not take a server from the others.
    if (retryable_status && !error_answer) {
      UpstreamAnswered(L, up, ServerError(grpc_status), call.answered_at, std::nullopt);
    }
    if (call.timed_out && !c.DeadlinePassed()) ConnectionFailed(L, up);
    H2Abandon(call);
    if (c.DeadlinePassed()) break;
    if (i == 0 && c.order.size() > 1) {
      L.sticky.Stick(c.stream_id, c.entry->primary.address, c.entry->standby.address,
                     L.clock.Now());
    }
    // A stream that lived here (it was answered) and has no upstream left of
    // those it was admitted with: a camera's stream outlives many faults,
    // and the routes have moved on since it began. It goes on where its
    // route points now, paid for by the retry budget as any attempt is.
    // So does one whose next upstream is of routes that moved since (that
    // standby may be fenced by now: an XID flood's second node).
    const bool order_stale = i + 1 < c.order.size() && c.RoutesMoved();
    if ((i + 1 == c.order.size() && can_continue()) || order_stale) {
      if (!c.Rechoose(&up)) co_return;
      i = static_cast<size_t>(-1);  // the loop's ++i: the fresh order's first
    }
    if (i + 1 < c.order.size() && !decoupled) {
      Inc(L.stats.grpc_stream_continuations);
      spdlog::info(
          "router: stream {}: gRPC stream broke with {} answer(s) owed ({}); "
          "continuing it on {}",
          c.stream_id, unanswered.size(), c.last_failure, c.order[i + 1]->node);
    }
  }
  c.AllFailed();
}

}  // namespace gpuha::router::grpc_proxy
