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

// What broke a stream's attempt, in words.
std::string StreamBreak(const H2Call& call, std::string_view grpc_status, bool error_answer,
                        bool deadline_passed) {
  if (error_answer) return "answered a message with an error";
  if (call.hung_cancel) return "hung";
  if (call.timed_out) return deadline_passed ? "grpc-timeout passed" : "an answer overdue";
  if (call.failed) return call.why;
  if (!grpc_status.empty()) {
    return absl::StrCat("grpc-status ", std::string(grpc_status), " ",
                        std::string(H2Find(call.trailers, "grpc-message")),
                        std::string(H2Find(call.headers, "grpc-message")));
  }
  return "the stream ended without a status";
}

// How a step of an attempt leaves the stream.
enum class Step {
  kGoOn,        // the attempt goes on
  kNotStarted,  // the upstream's stream could not be opened
  kBroke,       // the attempt is over (ended early, broke, judged): the next may go on
  kEnded,       // the stream is over: answered, or its client left
};

// One streaming call across its attempts: the messages owed an answer
// (held until answered, and sent again in order to the next upstream) and
// when each side last spoke.
class StreamRelay {
 public:
  explicit StreamRelay(CallCtx& c)
      : c_(c),
        L_(c.L),
        conn_(*c.conn),
        id_(c.id),
        config_(c.L.config),
        max_message_(LimitsOf(c.L.config).max_request_bytes) {}
  // The attempts, each on the pipeline's next upstream, until the stream ends.
  awaitable<void> Run();

 private:
  // One attempt on one upstream.
  struct Attempt {
    Attempt(Loop& L, UpstreamState& up) : up(up), call(L) {}
    UpstreamState& up;
    // The upstream stream's body: the unanswered messages, then the next
    // (declared before the call, whose reads point into it).
    std::string out;
    H2Call call;
    size_t parsed = 0;           // of call.data: answers relayed so far
    bool answered_here = false;  // this upstream answered one of this stream's messages
    bool error_answer = false;   // it answered one with an error (StreamAnswerIsError)
    bool backlogged = false;     // the client is behind on its answers (at the last take)
  };
  awaitable<Step> Try(UpstreamState& up);
  Step Take(Attempt& a);
  Step RelayAnswers(Attempt& a);
  Step Judge(Attempt& a, bool timer_ran_out, Clock::time_point* wake_at);
  Step End(Attempt& a);
  // Whether messages held back can be taken now (answers made room, or the
  // client read its backlog).
  bool MoreToTake() const {
    const H2Stream* held = conn_.h2.Find(id_);
    return held != nullptr && unanswered_.size() < kMaxUnanswered &&
           !conn_.h2.AnswerBacklogged(id_) && WholeMessage(held->body) > 0;
  }
  // Whether a break here can go on elsewhere: to the next upstream, or (a
  // stream that lived here) to where its route points now. A decoupled
  // model's stream is not continued; the next attempt says so.
  bool CanContinue(const Attempt& a) const {
    return c_.pipe.HasNext() || (a.answered_here && !decoupled_);
  }

  CallCtx& c_;
  Loop& L_;
  H2ClientConn& conn_;
  const int32_t id_;
  const RouterConfig& config_;
  const size_t max_message_;
  std::deque<std::string> unanswered_;           // sent upstream, no answer yet (oldest first)
  std::deque<Clock::time_point> sent_at_;        // when each was (last) sent
  Clock::time_point last_answer_{};              // the last answer of this stream
  Clock::time_point last_heard_ = Clock::now();  // the client's last bytes
  size_t heard_ = 0;  // bytes of its body not yet taken, at the last look
  bool decoupled_ = false;
  bool client_done_ = false;
};

awaitable<void> StreamRelay::Run() {
  // A stream that lived on an upstream until it failed takes its
  // upstreams anew (Pipeline::Lived).
  std::optional<Refusal> refused;
  while (UpstreamState* up = c_.pipe.Next(&refused)) {
    if (!c_.ServesGrpc(*up)) continue;
    if (c_.DeadlinePassed()) break;
    if (c_.pipe.attempts() > 1 && decoupled_) {
      c_.Answer(Reason::kUpstreamFailed,
                absl::StrCat("the model is decoupled (its answers are not one per request), so "
                             "its stream cannot be continued on the standby; the stream broke: ",
                             c_.pipe.last_failure()));
      co_return;
    }
    const Step step = co_await Try(*up);
    if (step == Step::kEnded) co_return;
    if (step == Step::kNotStarted) continue;
    if (c_.DeadlinePassed()) break;
    if (c_.pipe.HasNext() && !decoupled_) {
      Inc(L_.stats.grpc_stream_continuations);
      spdlog::info(
          "router: stream {}: gRPC stream broke with {} answer(s) owed ({}); "
          "continuing it on {}",
          c_.pipe.stream_id(), unanswered_.size(), c_.pipe.last_failure(), c_.pipe.upcoming().node);
    }
  }
  c_.AllFailed(refused);
}

// One attempt: the unanswered messages sent again, then the client's new
// ones taken and the upstream's answers relayed as each side sends, until
// the stream ends or the attempt breaks.
awaitable<Step> StreamRelay::Try(UpstreamState& up) {
  Attempt a(L_, up);
  for (const std::string& m : unanswered_) a.out += m;
  H2Call& call = a.call;
  call.streaming = true;
  call.body_done = false;
  call.body = &a.out;
  ClientHook hook(conn_, id_, call);
  if (H2Stream* cs = conn_.h2.Find(id_)) cs->on_data = [&call] { call.wake.cancel(); };
  struct Unhook {
    H2ClientConn& c;
    int32_t id;
    ~Unhook() {
      if (H2Stream* s = c.h2.Find(id)) s->on_data = nullptr;
    }
  } unhook{conn_, id_};
  up.in_flight++;
  struct Dec {
    int64_t* v;
    ~Dec() { --*v; }
  } dec{&up.in_flight};
  const bool started = co_await H2Start(L_, up, c_.UpstreamHeaders(up), call);
  if (call.client_gone || conn_.closed) {
    Inc(L_.stats.client_aborts);
    co_return Step::kEnded;
  }
  if (!started) {
    c_.pipe.Failed({.why = call.why});
    co_return Step::kNotStarted;
  }
  std::fill(sent_at_.begin(), sent_at_.end(), Clock::now());  // sent again now
  bool timer_ran_out = false;
  for (;;) {
    if (Take(a) == Step::kEnded || RelayAnswers(a) == Step::kEnded) co_return Step::kEnded;
    Clock::time_point wake_at;
    const Step step = Judge(a, timer_ran_out, &wake_at);
    if (step == Step::kEnded) co_return Step::kEnded;
    if (step == Step::kBroke) break;
    timer_ran_out = false;
    if (MoreToTake()) continue;  // taken now, not at the next event
    error_code ec;
    call.wake.expires_at(wake_at);
    co_await call.wake.async_wait(Redirect(ec));
    if (!ec) timer_ran_out = true;  // take in what came, then judge
  }
  call.waiting_hook.unlink();
  co_return End(a);
}

// The client's new whole messages go upstream, and are held until answered.
Step StreamRelay::Take(Attempt& a) {
  H2Stream* cs = conn_.h2.Find(id_);
  if (cs == nullptr) {
    Inc(L_.stats.client_aborts);
    return Step::kEnded;  // the client left
  }
  size_t took = 0;
  std::string_view b(cs->body);
  // A client that does not read its answers gets no more of its messages
  // taken (nor its window back) until it does, and no more than
  // kMaxUnanswered are asked at once: the answers the router holds for it
  // stay bounded (1 MiB unsent, plus the answers in flight).
  a.backlogged = conn_.h2.AnswerBacklogged(id_);
  while (!a.backlogged && unanswered_.size() < kMaxUnanswered) {
    std::string_view rest = b.substr(took);
    if (rest.size() >= 5) {
      const auto* p = reinterpret_cast<const unsigned char*>(rest.data());
      const size_t len = (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4];
      if (len + 5 > max_message_) {
        c_.Answer(Reason::kBodyTooLarge,
                  absl::StrCat("a stream message over ", max_message_, " bytes"));
        return Step::kEnded;
      }
    }
    size_t n = WholeMessage(rest);
    if (n == 0) break;
    unanswered_.emplace_back(rest.substr(0, n));
    sent_at_.push_back(Clock::now());
    if (a.call.body_sent > 64 * 1024) {  // keep the upstream body from growing
      a.out.erase(0, a.call.body_sent);
      a.call.body_sent = 0;
    }
    a.out += unanswered_.back();
    took += n;
  }
  if (took > 0) {
    conn_.h2.Consume(id_, took);
    H2Resume(a.call);
  }
  if (took > 0 || cs->body.size() != heard_) last_heard_ = Clock::now();
  heard_ = cs->body.size();
  if (cs->complete && !client_done_) {
    // Whole messages held back (128 asked, or a client behind on its
    // answers) are taken later; a part of one is a broken end.
    if (!cs->body.empty() && WholeMessage(cs->body) == 0) {
      c_.Answer(Reason::kBadRequest, "the stream ended inside a message");
      return Step::kEnded;
    }
    client_done_ = cs->body.empty();
  }
  if (client_done_ && !a.call.body_done) {
    a.call.body_done = true;
    H2Resume(a.call);
  }
  return Step::kGoOn;
}

// The upstream's whole answers go to the client, each retiring the oldest
// unanswered request (whose bytes go back to the client's window).
Step StreamRelay::RelayAnswers(Attempt& a) {
  H2Call& call = a.call;
  std::string_view d(call.data);
  while (size_t n = WholeMessage(d.substr(a.parsed))) {
    // An error answer while another upstream is left and the retry budget
    // pays for it: this one may be failing (a CUDA error, an engine gone
    // bad), and the stream goes on there with this message unanswered, as
    // an HTTP 500 is re-sent. From the last upstream the error is
    // relayed: the stream lives on.
    if (!unanswered_.empty() && config_.retry_5xx && c_.pipe.HasNext() && !decoupled_ &&
        L_.retry_budget.Balance(L_.now) >= 1 && StreamAnswerIsError(d.substr(a.parsed, n))) {
      a.error_answer = true;
      break;
    }
    if (!c_.began) {
      conn_.h2.RespondStreaming(id_, RelayHeaders(call.headers));
      c_.began = true;
    }
    conn_.h2.SendData(id_, d.substr(a.parsed, n));
    a.parsed += n;
    // A decoupled model answers without being asked: a client that reads
    // none of it would have the router hold it all.
    const size_t max_unread = LimitsOf(config_).max_buffered_bytes;
    if (H2Stream* held = conn_.h2.Find(id_); held != nullptr && held->unsent() > max_unread) {
      c_.Answer(Reason::kBodyTooLarge,
                absl::StrCat("the client left over ", max_unread, " bytes of its answers unread"));
      return Step::kEnded;
    }
    last_answer_ = Clock::now();
    if (unanswered_.empty()) {
      decoupled_ = true;  // more answers than requests
    } else {
      UpstreamAnswered(
          L_, a.up, false, L_.clock.Now(),
          std::chrono::duration_cast<common::Duration>(last_answer_ - sent_at_.front()));
      conn_.h2.Release(id_, unanswered_.front().size());
      unanswered_.pop_front();
      sent_at_.pop_front();
      a.answered_here = true;
      c_.pipe.Lived();
    }
    conn_.Kick();
  }
  if (a.parsed > 64 * 1024) {
    call.data.erase(0, a.parsed);
    a.parsed = 0;
  }
  return Step::kGoOn;
}

// The verdicts on the attempt as it stands: watched while an answer is
// owed, ended by a drain or an idle stream, broken by its upstream's end,
// a verdict or an answer overdue. `timer_ran_out`: the wait's timer fired
// (judged after the events already queued are taken in). Else, when to
// judge again.
Step StreamRelay::Judge(Attempt& a, bool timer_ran_out, Clock::time_point* wake_at) {
  H2Call& call = a.call;
  // Owed since the later of its sending and the last answer: answers come
  // in order, so one queued behind another is not late.
  const Clock::time_point owed_since =
      unanswered_.empty() ? Clock::time_point() : std::max(sent_at_.front(), last_answer_);
  // Watched by the hung and stall verdicts while an answer is owed.
  if (unanswered_.empty()) {
    call.waiting_hook.unlink();
  } else {
    call.waiting_since =
        L_.clock.Now() - std::chrono::duration_cast<common::Duration>(Clock::now() - owed_since);
    call.expect = {};
    if (!call.waiting_hook.is_linked()) a.up.waiting.push_back(call);
  }
  if (call.client_gone || conn_.closed) {
    Inc(L_.stats.client_aborts);
    return Step::kEnded;
  }
  // A drain (Router::Drain) ends the stream at its first quiet moment: no
  // answer owed, no message begun. The client opens its next call on
  // another connection (the GOAWAY sent it elsewhere: the router that took
  // the listeners, or the next one), and no message is cut, as the
  // drain's timeout would cut one.
  if (L_.shared.draining.load(std::memory_order_relaxed) && unanswered_.empty() && heard_ == 0 &&
      !decoupled_) {
    c_.Answer(Reason::kDraining,
              "the router is draining (a restart or a stop): open the stream again");
    return Step::kEnded;
  }
  if (call.done || call.hung_cancel || a.error_answer) return Step::kBroke;
  // An answer owed past response_timeout: the upstream is taken for stuck,
  // as a unary call's would be.
  const Clock::time_point overdue_at =
      unanswered_.empty() ? Clock::time_point::max() : owed_since + config_.limits.response_timeout;
  // Nothing owed, and neither side has said anything for idle_timeout
  // (Envoy's stream idle timeout), or body_timeout inside a message: the
  // stream ends, since the connection's read deadline leaves a call being
  // worked on alone.
  const bool mid_message = heard_ > 0 && !a.backlogged;
  const milliseconds idle_for =
      mid_message || a.backlogged ? config_.limits.body_timeout : config_.limits.idle_timeout;
  const Clock::time_point idle_at = unanswered_.empty()
                                        ? std::max(last_heard_, last_answer_) + idle_for
                                        : Clock::time_point::max();
  if (timer_ran_out && Clock::now() >= idle_at) {
    c_.Answer(Reason::kStreamIdle,
              a.backlogged ? absl::StrCat("the client read none of its answers for body_timeout (",
                                          idle_for.count(), " ms)")
              : mid_message
                  ? absl::StrCat("the client stopped inside a message for body_timeout (",
                                 idle_for.count(), " ms)")
                  : absl::StrCat("the stream was idle for idle_timeout (", idle_for.count(),
                                 " ms): no message from the client, no answer owed"));
    return Step::kEnded;
  }
  if (timer_ran_out && Clock::now() >= std::min(overdue_at, c_.deadline)) {
    call.timed_out = true;
    return Step::kBroke;
  }
  *wake_at = std::min({overdue_at, idle_at, c_.deadline});
  return Step::kGoOn;
}

// The attempt is over: its end relayed (whole, or the upstream's own
// status), or the stream broke and the next attempt may go on.
Step StreamRelay::End(Attempt& a) {
  H2Call& call = a.call;
  UpstreamState& up = a.up;
  if (call.response_too_large) {
    c_.Answer(Reason::kBodyTooLarge, absl::StrCat(up.node, ": ", call.why));
    return Step::kEnded;
  }
  const std::string_view grpc_status = GrpcStatusOf(call);
  const bool retryable_status = RetryableStatus(grpc_status);
  if (!a.error_answer && call.done && !call.failed && H2Find(call.headers, ":status") == "200" &&
      !grpc_status.empty() && !(retryable_status && config_.retry_5xx && CanContinue(a)) &&
      (grpc_status != "0" || (unanswered_.empty() && client_done_))) {
    // Ended: whole, or with the upstream's own status, which is relayed.
    if (ServerError(grpc_status)) UpstreamAnswered(L_, up, true, call.answered_at, std::nullopt);
    if (!c_.began) {
      conn_.h2.Respond(id_, RelayHeaders(call.headers), "", EndingTrailers(call));
    } else {
      conn_.h2.Finish(id_, EndingTrailers(call));
    }
    conn_.Kick();
    return Step::kEnded;
  }
  // The stream broke with answers owed, ended early, or ended UNAVAILABLE.
  // An error answer is not held against the upstream (its ejection):
  // error_message cannot say whether the server or the request was bad,
  // and one tenant's bad frames must not take a server from the others.
  if (retryable_status && !a.error_answer) {
    UpstreamAnswered(L_, up, ServerError(grpc_status), call.answered_at, std::nullopt);
  }
  if (call.timed_out && !c_.DeadlinePassed()) ConnectionFailed(L_, up);
  H2Abandon(call);
  c_.pipe.Failed({.why = StreamBreak(call, grpc_status, a.error_answer, c_.DeadlinePassed()),
                  .hung = call.hung_cancel,
                  .answered = retryable_status || a.error_answer,
                  .server_error = retryable_status || a.error_answer,
                  .timeout = c_.DeadlinePassed(),
                  .client_deadline = c_.DeadlinePassed()});
  return Step::kBroke;
}

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
  CallCount count{*conn};
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.grpc_calls);
  Inc(L.stats.grpc_streams);
  CallCtx c(L, conn, id);
  c.request = s->headers;  // its body keeps coming
  if (!Admit(c)) co_return;
  c.pipe.Streaming();
  conn->h2.StartStreaming(id);
  StreamRelay relay(c);
  co_await relay.Run();
}

}  // namespace gpuha::router::grpc_proxy
