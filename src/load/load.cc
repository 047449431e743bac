#include "load/load.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/net_util.h"
#include "common/sse.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "worker/llm.h"
#include "worker/model.h"
#include "worker/model_grpc.h"

namespace gpuha::load {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int64_t UnixNanos() { return common::RealClock::Get()->UnixNanos(); }

// Infer mode: a few frames made once, each request sends frame i with frame
// i-1 as its previous one, and the expected answer is the model run here.
struct Frame {
  std::string body;
  worker::CvResult expected;
  inference::ModelInferRequest grpc;  // the same frame as a gRPC call
};

std::vector<Frame> MakeFrames(int side) {
  constexpr int kFrames = 8;
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> images(kFrames, std::vector<uint8_t>(size_t(side) * side * 3));
  for (auto& img : images) {
    for (uint8_t& b : img) b = static_cast<uint8_t>(rng());
  }
  std::vector<Frame> frames;
  for (int i = 0; i < kFrames; ++i) {
    const auto& img = images[i];
    const auto& prev = images[(i + kFrames - 1) % kFrames];
    frames.push_back(
        {worker::MakeInferRequestJson(absl::StrCat("frame-", i), img, &prev, side, side),
         worker::ComputeCv(img.data(), prev.data(), side, side, 3),
         worker::MakeGrpcInferRequest(absl::StrCat("frame-", i), img, &prev, side, side)});
  }
  return frames;
}

bool SameAnswer(const worker::CvResult& a, const worker::CvResult& b) {
  return a.histogram == b.histogram && std::abs(a.brightness - b.brightness) < 1e-3f &&
         std::abs(a.motion - b.motion) < 1e-5f;
}

std::string GrpcCodeName(grpc::StatusCode c) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : absl::StrCat("code ", i);
}

// A failed call's name in the report: "grpc CODE", and the router's reason
// when it made the answer itself (x-gpuha-error: "grpc UNAVAILABLE no_capacity").
std::string GrpcFailure(const std::string& what, const grpc::Status& st,
                        const grpc::ClientContext& ctx) {
  std::string out = absl::StrCat(what, " ", GrpcCodeName(st.error_code()));
  const auto& md = ctx.GetServerTrailingMetadata();
  if (auto it = md.find("x-gpuha-error"); it != md.end()) {
    absl::StrAppend(&out, " ", std::string(it->second.data(), it->second.size()));
  }
  return out;
}

// One gRPC call of the load, from its start to its answer on the loop.
struct GrpcCall {
  explicit GrpcCall(net::io_context& ioc) : wake(ioc) {}
  grpc::ClientContext ctx;
  inference::ModelInferResponse resp;
  grpc::Status status;
  bool done = false;
  net::steady_timer wake;
};

// The calls out, so that a run's end can cancel them and wait for their
// last callbacks (which run on grpc++'s threads) before the loop goes.
class GrpcCalls {
 public:
  explicit GrpcCalls(net::io_context& ioc) : ioc_(ioc) {}
  void Begin(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    out_.insert(c);
  }
  // From a callback: `f` runs on the loop unless the run is over.
  template <class F>
  void Post(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) net::post(ioc_, std::forward<F>(f));
  }
  // From a call's last callback: as Post, and the call is no longer out.
  template <class F>
  void End(grpc::ClientContext* c, F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    out_.erase(c);
    if (!closed_) net::post(ioc_, std::forward<F>(f));
    cv_.notify_all();
  }
  // The calls stay alive (their owners outlive this), so they are
  // cancelled outside the lock their callbacks take.
  void CancelAndWait() {
    std::vector<grpc::ClientContext*> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      out.assign(out_.begin(), out_.end());
    }
    for (grpc::ClientContext* c : out) c->TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return out_.empty(); });
  }

 private:
  net::io_context& ioc_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<grpc::ClientContext*> out_;
  bool closed_ = false;
};

// A message of a streaming call waiting for its answer.
class StreamCall;
// A message's end when its call ended without the router having taken it
// (a drain): it is sent again, on a new call.
const std::string kNotTaken = "not taken: the router drained";
struct StreamMessage {
  explicit StreamMessage(net::io_context& ioc) : wake(ioc) {}
  std::string id;
  StreamCall* call = nullptr;  // the call that carries it
  const Frame* frame = nullptr;
  bool done = false;
  std::string failure, node;
  net::steady_timer wake;
  void Finish(std::string why, std::string by = "") {
    if (done) return;
    done = true;
    failure = std::move(why);
    node = std::move(by);
    wake.cancel();
  }
};

// One ModelStreamInfer call of a load stream. Its messages are answered one
// each, in order (the model is not decoupled), and each answer is checked
// against the frame its message sent. grpc++ calls the reactions on its
// threads; each hands its event to the loop, which alone touches the state.
class StreamCall : public grpc::ClientBidiReactor<inference::ModelInferRequest,
                                                  inference::ModelStreamInferResponse> {
 public:
  explicit StreamCall(GrpcCalls* calls) : calls_(calls) {}

  // On the loop: the call starts, with its metadata already in ctx. The
  // hold keeps the call open for writes the loop starts, outside grpc++'s
  // reactions, until the read side has ended.
  void Start(inference::GRPCInferenceService::Stub* stub) {
    calls_->Begin(&ctx);
    stub->async()->ModelStreamInfer(&ctx, this);
    AddHold();
    StartRead(&in_);
    StartCall();
  }
  // On the loop: a message out, answered through `m`.
  void Send(inference::ModelInferRequest req, std::shared_ptr<StreamMessage> m) {
    unanswered_.push_back(std::move(m));
    to_write_.push_back(std::move(req));
    if (to_write_.size() == 1) WriteFront();
  }
  // On the loop: every message still waiting fails with `why`.
  void FailAll(const std::string& why) {
    for (auto& m : unanswered_) m->Finish(why);
    unanswered_.clear();
  }
  // On the loop: OnDone's news has come, so nothing of grpc++'s refers to
  // this any more and it may go.
  bool finished() const { return finished_; }
  // Whether its read side has ended: it takes no more messages, and a new
  // call should carry the next ones.
  bool read_ended() {
    std::lock_guard<std::mutex> lock(mu_);
    return read_ended_;
  }

  grpc::ClientContext ctx;

 private:
  void WriteFront() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!read_ended_) StartWrite(&to_write_.front());
  }
  void OnWriteDone(bool ok) override {
    calls_->Post([this, ok] {
      to_write_.pop_front();
      // A failed write ends the call; OnDone says how.
      if (ok && !to_write_.empty()) WriteFront();
    });
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream ended: no more writes, and OnDone follows the hold
      {
        std::lock_guard<std::mutex> lock(mu_);
        read_ended_ = true;
      }
      RemoveHold();
      return;
    }
    auto answer = std::make_shared<inference::ModelStreamInferResponse>(std::move(in_));
    in_.Clear();
    calls_->Post([this, answer] { Answered(*answer); });
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& st) override {
    // The last reaction; its news is the last thing posted for this call.
    calls_->End(&ctx, [this, st] {
      finished_ = true;
      std::string why = st.ok() ? std::string("stream ended before its answers")
                                : GrpcFailure("grpc stream", st, ctx);
      // A router ends a stream for its drain only once it owes no answer:
      // the messages still out were never taken, and go on a new call.
      if (why == "grpc stream UNAVAILABLE draining") why = kNotTaken;
      FailAll(why);
    });
  }
  // On the loop: the answer to the oldest message out.
  void Answered(const inference::ModelStreamInferResponse& a) {
    if (unanswered_.empty()) return;  // failed already (a timeout)
    std::shared_ptr<StreamMessage> m = std::move(unanswered_.front());
    unanswered_.pop_front();
    const std::string node = worker::NodeOf(a.infer_response());
    if (!a.error_message().empty()) {
      m->Finish("stream error", node);
    } else if (a.infer_response().id() != m->id) {
      m->Finish("answer out of order or duplicated", node);
    } else {
      auto got = worker::FromGrpc(a.infer_response());
      m->Finish(got.ok() && SameAnswer(*got, m->frame->expected) ? "" : "wrong answer", node);
    }
  }

  GrpcCalls* calls_;
  inference::ModelStreamInferResponse in_;             // grpc++'s, between StartRead and OnReadDone
  std::deque<inference::ModelInferRequest> to_write_;  // front: being written
  std::deque<std::shared_ptr<StreamMessage>> unanswered_;
  std::mutex mu_;  // read_ended_, between the loop's writes and the read side's end
  bool read_ended_ = false;
  bool finished_ = false;
};

// A kept-alive connection and when it is too old to reuse: a second before
// the server said it closes idle ones (Keep-Alive: timeout=N), else never.
struct Pooled {
  std::unique_ptr<beast::tcp_stream> c;
  Clock::time_point until = Clock::time_point::max();
};

struct StreamState {
  std::string id;
  std::vector<Pooled> idle;
  Clock::time_point last_answer;
  // Stall accounting (see StreamReport::max_stall_ms): requests out that are
  // not deliberately slow, and since when the stream has waited for an answer.
  int outstanding = 0;
  std::optional<Clock::time_point> stalled_since;
  StreamReport report;
  // grpc_stream: the stream's open call, and calls given up (a message
  // timed out) until their end has been heard.
  std::unique_ptr<StreamCall> call;
  std::vector<std::unique_ptr<StreamCall>> ended;
};

class Runner {
 public:
  Runner(const LoadOptions& o, net::io_context& ioc) : o_(o), ioc_(ioc), rng_(42) {
    if (o.infer || o.grpc || o.grpc_stream) frames_ = MakeFrames(o.image_side);
    routers_.emplace_back(net::ip::make_address(o.host), o.port);
    for (const common::HostPort& r : o.more_routers) {
      routers_.emplace_back(net::ip::make_address(r.host), r.port);
    }
    if (o.grpc || o.grpc_stream) {
      stub_ = inference::GRPCInferenceService::NewStub(
          grpc::CreateChannel(GrpcTarget(), grpc::InsecureChannelCredentials()));
      calls_ = std::make_unique<GrpcCalls>(ioc_);
    }
    for (int i = 0; i < o.streams; ++i) {
      streams_.push_back(std::make_unique<StreamState>());
      streams_.back()->id = o.stream_prefix + std::to_string(i);
      streams_.back()->report.stream = streams_.back()->id;
    }
  }

  net::awaitable<void> OpenLoop() {
    net::steady_timer t(ioc_);
    auto interval = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / o_.rate));
    auto next = start_;
    size_t i = 0;
    while (Running()) {
      next += interval;
      StreamState& s = *streams_[i++ % streams_.size()];
      net::co_spawn(ioc_, One(s), net::detached);
      if (next > Clock::now()) {
        t.expires_at(next);
        error_code ec;
        co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
      }
    }
  }

  net::awaitable<void> ClosedLoop(size_t client) {
    while (Running()) {
      co_await One(*streams_[client % streams_.size()]);
    }
  }

  // False once the duration is over or the caller asked to stop; a stop
  // ends the run (and its gap accounting) now.
  bool Running() {
    if (o_.stop != nullptr && o_.stop->load() && Clock::now() < end_) end_ = Clock::now();
    return Clock::now() < end_;
  }

  std::string Target(const StreamState& s) const {
    return o_.direct ? o_.path : absl::StrCat("/streams/", s.id, o_.path);
  }

  // Where the pooled connection comes from: the stream's idle list (its
  // newest connection not too old; `reused` set), or a new one to the
  // router in use, or the next that takes it (nullptr and `failure` set
  // when none does). `router` says which router a new one went to.
  net::awaitable<std::unique_ptr<beast::tcp_stream>> Connection(StreamState& s,
                                                                std::string* failure,
                                                                bool* reused = nullptr,
                                                                bool fresh = false,
                                                                size_t* router = nullptr) {
    if (reused != nullptr) *reused = false;
    while (!fresh && !s.idle.empty()) {
      Pooled p = std::move(s.idle.back());
      s.idle.pop_back();
      if (Clock::now() >= p.until) continue;  // the server may be closing it: closed here
      if (reused != nullptr) *reused = true;
      co_return std::move(p.c);
    }
    for (size_t tried = 0; tried < routers_.size(); ++tried) {
      const size_t at = router_;
      auto c = std::make_unique<beast::tcp_stream>(ioc_);
      c->expires_after(o_.timeout);
      error_code ec;
      co_await c->async_connect(routers_[at], net::redirect_error(net::use_awaitable, ec));
      if (!ec) {
        if (router != nullptr) *router = at;
        failure->clear();  // an earlier router's refusal is not this request's failure
        co_return c;
      }
      *failure = "connect: " + ec.message();
      NextRouter(at);
    }
    co_return nullptr;
  }

  // Moves the load off router `from` (unless another request already did).
  void NextRouter(size_t from) {
    if (routers_.size() < 2 || router_ != from) return;
    router_ = (from + 1) % routers_.size();
    report_.router_failovers++;
  }

  // Sends `req` on a connection (pooled when one is) and reads the answer's
  // head, and with `whole` its body too, into `p`. A connection that brings
  // nothing back was not answered, so the request goes again on a new one:
  // a kept-alive one the other side closed as the request went out (the
  // keep-alive race, counted apart as stale_retries), as curl and Go's
  // client do; a new one whose router died with it in hand, to the next
  // router, once per router. Null: no connect succeeded (`failure` says how).
  net::awaitable<std::unique_ptr<beast::tcp_stream>> Send(
      StreamState& s, const std::string& req, bool whole, beast::flat_buffer& buf,
      std::optional<http::response_parser<http::string_body>>& p, error_code& ec,
      std::string* failure) {
    bool reused = false;
    size_t router = 0;
    std::unique_ptr<beast::tcp_stream> c = co_await Connection(s, failure, &reused, false, &router);
    size_t fresh_left = routers_.size();  // new connections that may still come back empty
    while (c) {
      c->expires_after(o_.timeout);
      p.emplace();
      p->body_limit(64 << 20);
      co_await net::async_write(*c, net::buffer(req), net::redirect_error(net::use_awaitable, ec));
      if (!ec && whole) {
        co_await http::async_read(*c, buf, *p, net::redirect_error(net::use_awaitable, ec));
      } else if (!ec) {
        co_await http::async_read_header(*c, buf, *p, net::redirect_error(net::use_awaitable, ec));
      }
      if (!ec || ec == beast::error::timeout || buf.size() > 0 || p->got_some() || !o_.resend) {
        break;
      }
      if (reused) {
        report_.stale_retries++;
      } else {
        if (--fresh_left == 0) break;
        NextRouter(router);
      }
      reused = false;
      ec = {};
      c = co_await Connection(s, failure, nullptr, /*fresh=*/true, &router);
    }
    co_return c;
  }

  // One streamed completion: every token timed, the whole answer checked.
  net::awaitable<void> OneSse(StreamState& s) {
    report_.sent++;
    in_flight_++;
    const uint64_t n = report_.sent;
    const bool chat = o_.llm_chat && n % 2 == 1;
    const bool ids = o_.llm_model == worker::kLlmBpeModelName;
    nlohmann::json b = {{"model", o_.llm_model},
                        {"max_tokens", o_.max_tokens},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
    const std::string prompt = absl::StrCat("load ", s.id, " request ", n);
    if (chat) {
      b["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
    } else {
      b["prompt"] = prompt;
    }
    if (o_.llm_seeded && (n / 2) % 2 == 1) {
      b["seed"] = n;
      b["temperature"] = 0.7;
    }
    if (ids) b["return_token_ids"] = true;
    const bool structured = o_.llm_structured && n % 4 == 3;
    if (structured) {
      b["response_format"] = {{"type", "json_schema"},
                              {"json_schema",
                               {{"name", "answer"},
                                {"schema",
                                 {{"type", "object"},
                                  {"properties", {{"answer", {{"type", "string"}}}}},
                                  {"required", {"answer"}}}}}}};
    }
    const std::string body = b.dump();
    const worker::LlmApi api = chat ? worker::LlmApi::kChat : worker::LlmApi::kCompletions;
    const worker::LlmAnswer want = worker::Complete(*worker::ParseLlmRequest(api, body));
    std::string target = Target(s);
    if (chat) target = target.substr(0, target.rfind('/')) + "/chat/completions";
    const std::string req = absl::StrCat(
        "POST ", target, " HTTP/1.1\r\nHost: ", o_.host, "\r\n",
        o_.api_key.empty() ? "" : "X-Api-Key: " + o_.api_key + "\r\n",
        "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    const auto sent_at = Clock::now();
    std::string failure;
    std::string node;
    bool keep = false;
    error_code ec;
    beast::flat_buffer buf;
    std::optional<http::response_parser<http::string_body>> head;
    std::unique_ptr<beast::tcp_stream> c = co_await Send(s, req, false, buf, head, ec, &failure);
    Clock::time_point keep_until = Clock::time_point::max();
    if (c) {
      http::response_parser<http::string_body>& p = *head;
      common::SseSplitter split;
      size_t fed = 0;
      int tokens = 0;
      Clock::time_point last = sent_at;
      double longest = 0;
      while (!ec && p.get().result_int() == 200 && !p.is_done()) {
        co_await http::async_read_some(*c, buf, p, net::redirect_error(net::use_awaitable, ec));
        const auto now = Clock::now();
        const std::string& b = p.get().body();
        split.Feed(std::string_view(b).substr(fed), [&](std::string_view raw) {
          common::SseEvent e = common::ParseSseEvent(raw);
          // A chunk with text is a token (a role or usage chunk is not).
          const char* key = chat ? "\"content\":\"" : "\"text\":\"";
          const size_t at = e.data.find(key);
          if (at == std::string::npos || e.data[at + std::strlen(key)] == '"') return;
          ++tokens;
          double gap = Ms(now - last);
          if (tokens == 1) {
            ttfts_.push_back(gap);
          } else {
            gaps_.push_back(gap);
          }
          longest = std::max(longest, gap);
          last = now;
        });
        fed = b.size();
      }
      report_.tokens += static_cast<uint64_t>(tokens);
      s.report.max_stall_ms = std::max(s.report.max_stall_ms, longest);
      node = std::string(p.get()["X-Gpuha-Node"]);
      // Once the head came, a broken body is a cut answer, tokens or not.
      const bool began = p.is_header_done() && p.get().result_int() == 200;
      if (ec == beast::error::timeout) {
        failure = began ? "cut: timeout mid-answer" : "timeout";
      } else if (ec) {
        failure = began ? "cut: connection closed mid-answer" : "read: " + ec.message();
      } else if (p.get().result_int() != 200) {
        failure = absl::StrCat("http_", p.get().result_int());
        if (auto why = p.get()["X-Gpuha-Error"]; !why.empty()) failure += " " + std::string(why);
      } else {
        failure = CheckAnswer(p.get().body(), api, want, ids, structured);
        keep = failure.empty() && p.keep_alive();
        if (keep) keep_until = KeptUntil(p.get());
      }
    }
    in_flight_--;
    Record(s, sent_at, Clock::now(), failure, node, keep ? std::move(c) : nullptr, keep_until);
  }

  // Until when a connection whose last answer was `res` may be reused.
  template <class Message>
  static Clock::time_point KeptUntil(const Message& res) {
    auto v = res["Keep-Alive"];
    std::optional<int> s = common::KeepAliveTimeout(absl::string_view(v.data(), v.size()));
    if (!s) return Clock::time_point::max();
    return Clock::now() + std::chrono::seconds(*s - 1);
  }

  // One answer (or failure) in the report; a connection to keep goes back
  // to the stream's pool, to be reused until `keep_until`.
  void Record(StreamState& s, Clock::time_point sent_at, Clock::time_point now,
              const std::string& failure, const std::string& node,
              std::unique_ptr<beast::tcp_stream> keep,
              Clock::time_point keep_until = Clock::time_point::max()) {
    if (!node.empty() && failure.empty()) report_.served_by[node]++;
    if (o_.on_answer) o_.on_answer(Answer{&s.id, UnixNanos(), failure.empty(), node, failure});
    if (!failure.empty()) {
      report_.failed++;
      s.report.failed++;
      report_.failures[failure]++;
      return;
    }
    report_.ok++;
    s.report.ok++;
    latencies_.push_back(Ms(now - sent_at));
    if (now <= end_) {
      s.report.max_gap_ms = std::max(s.report.max_gap_ms, Ms(now - s.last_answer));
      s.last_answer = now;
    }
    if (keep && now < keep_until) {
      keep->expires_never();
      s.idle.push_back({std::move(keep), keep_until});
    }
  }

  // Empty when `sse` is the model's answer `want`, whole (token ID for
  // token ID with `ids`); else what is wrong.
  std::string CheckAnswer(const std::string& sse, worker::LlmApi api, const worker::LlmAnswer& want,
                          bool ids, bool structured) {
    if (sse.empty()) return "empty answer";
    auto got = worker::ParseStreamedAnswer(api, sse);
    if (!got.ok()) {
      std::string_view m(got.status().message().data(), got.status().message().size());
      if (structured && m.find("an error event") != std::string_view::npos &&
          m.find("response_format") != std::string_view::npos) {
        return "structured: ended by the error event";
      }
      if (m.find("an error event") != std::string_view::npos) return "error event";
      if (m.find("no [DONE]") != std::string_view::npos ||
          m.find("inside an event") != std::string_view::npos) {
        return "cut: no [DONE]";
      }
      return "malformed stream";
    }
    if (got->text.empty() && !want.text.empty()) return "empty answer";
    if (got->text != want.text) {
      return got->text.size() > want.text.size() ? "duplicated or extra text" : "wrong text";
    }
    if (got->finish_reason != want.finish_reason) return "wrong finish_reason";
    if (structured) {
      nlohmann::json doc = nlohmann::json::parse(got->text, nullptr, false);
      auto a = doc.is_object() ? doc.find("answer") : doc.end();
      if (a == doc.end() || !a->is_string()) return "structured: not a document of its schema";
    }
    if (got->completion_tokens != want.completion_tokens ||
        got->prompt_tokens != want.prompt_tokens) {
      return "wrong usage";
    }
    if (ids &&
        (got->token_ids != want.token_ids || got->prompt_token_ids != want.prompt_token_ids)) {
      return "wrong token_ids";
    }
    if (got->continued > 0) {
      if (got->continued_by != "token_ids" && got->continued_by != "text" &&
          got->continued_by != "restart") {
        return "continued, not saying how";
      }
      report_.continued++;
      if (got->continued_by == "token_ids") report_.continued_on_ids++;
      if (got->continued_by == "text") report_.continued_by_text++;
    }
    return "";
  }

  // A request (not a deliberately slow one) goes out on `s`...
  static void Out(StreamState& s, Clock::time_point sent_at) {
    s.outstanding++;
    if (!s.stalled_since) s.stalled_since = sent_at;
  }
  // ...and comes back: an answer ends the stream's wait, and requests
  // still out start the next one now; a failure leaves it waiting.
  void Back(StreamState& s, const std::string& failure, Clock::time_point now) {
    s.outstanding--;
    if (failure.empty() && s.stalled_since) {
      // A wait that ran past the run's end counts up to the end.
      if (*s.stalled_since < end_) {
        s.report.max_stall_ms =
            std::max(s.report.max_stall_ms, Ms(std::min(now, end_) - *s.stalled_since));
      }
      s.stalled_since = s.outstanding > 0 ? std::optional(now) : std::nullopt;
    }
  }

  // One unary ModelInfer call; grpc++ answers on its own thread, and the
  // answer is handed to this loop.
  net::awaitable<void> OneGrpc(StreamState& s) {
    report_.sent++;
    in_flight_++;
    const Frame& frame = frames_[report_.sent % frames_.size()];
    auto call = std::make_shared<GrpcCall>(ioc_);
    call->ctx.set_deadline(std::chrono::system_clock::now() + o_.timeout);
    if (!o_.api_key.empty()) call->ctx.AddMetadata("x-api-key", o_.api_key);
    if (!o_.direct) call->ctx.AddMetadata("x-gpuha-stream", s.id);
    const auto sent_at = Clock::now();
    Out(s, sent_at);
    calls_->Begin(&call->ctx);
    stub_->async()->ModelInfer(&call->ctx, &frame.grpc, &call->resp,
                               // Raw pointers: this frame holds the call until the loop has its
                               // answer, and a run's end waits for every callback (CancelAndWait).
                               [calls = calls_.get(), c = call.get()](grpc::Status st) {
                                 c->status = std::move(st);
                                 calls->End(&c->ctx, [c] {
                                   c->done = true;
                                   c->wake.cancel();
                                 });
                               });
    while (!call->done) {
      call->wake.expires_at(Clock::time_point::max());
      error_code ec;
      co_await call->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    std::string failure;
    std::string node = worker::NodeOf(call->resp);
    if (!call->status.ok()) {
      failure = GrpcFailure("grpc", call->status, call->ctx);
    } else {
      auto got = worker::FromGrpc(call->resp);
      if (!got.ok() || !SameAnswer(*got, frame.expected)) failure = "wrong answer";
    }
    const auto& md = call->ctx.GetServerInitialMetadata();
    if (auto n = md.find("x-gpuha-node"); node.empty() && n != md.end()) {
      node = std::string(n->second.data(), n->second.size());
    }
    const auto now = Clock::now();
    in_flight_--;
    Back(s, failure, now);
    Record(s, sent_at, now, failure, node, nullptr);
  }

  // The stream's open ModelStreamInfer call, opened when it has none (or
  // its last one ended).
  StreamCall& OpenStream(StreamState& s) {
    if (s.call && (s.call->finished() || s.call->read_ended()))
      s.ended.push_back(std::move(s.call));
    std::erase_if(s.ended, [](const std::unique_ptr<StreamCall>& c) { return c->finished(); });
    if (!s.call) {
      s.call = std::make_unique<StreamCall>(calls_.get());
      if (!o_.api_key.empty()) s.call->ctx.AddMetadata("x-api-key", o_.api_key);
      if (!o_.direct) s.call->ctx.AddMetadata("x-gpuha-stream", s.id);
      s.call->Start(stub_.get());
    }
    return *s.call;
  }

  // One message of the stream's ModelStreamInfer call, as a camera sends
  // frames: its answer is the next one the call brings back.
  net::awaitable<void> OneGrpcStream(StreamState& s) {
    report_.sent++;
    in_flight_++;
    const Frame& frame = frames_[report_.sent % frames_.size()];
    auto m = std::make_shared<StreamMessage>(ioc_);
    m->id = absl::StrCat(s.id, "-", report_.sent);
    m->frame = &frame;
    const auto sent_at = Clock::now();
    Out(s, sent_at);
    const auto deadline = sent_at + o_.timeout;
    m->failure = kNotTaken;
    while (m->failure == kNotTaken) {
      if (m->done) report_.stale_retries++;  // a drained call's: sent again
      m->done = false;
      m->failure.clear();
      StreamCall& call = OpenStream(s);
      m->call = &call;
      inference::ModelInferRequest req = frame.grpc;
      req.set_id(m->id);
      call.Send(std::move(req), m);
      m->wake.expires_at(deadline);
      co_await WaitAnswered(s, *m, deadline);
    }
    const auto now = Clock::now();
    in_flight_--;
    Back(s, m->failure, now);
    Record(s, sent_at, now, m->failure, m->node, nullptr);
  }

  // Until `m` is answered, failed, or given up at `deadline`.
  net::awaitable<void> WaitAnswered(StreamState& s, StreamMessage& m_ref,
                                    Clock::time_point deadline) {
    StreamMessage* m = &m_ref;
    while (!m->done) {
      error_code ec;
      co_await m->wake.async_wait(net::redirect_error(net::use_awaitable, ec));
      if (!m->done && Clock::now() >= deadline) {
        // Too late: the call is given up, its other messages with it, and
        // the stream's next message opens another.
        m->call->FailAll("timeout");
        m->call->ctx.TryCancel();
        if (s.call.get() == m->call) s.ended.push_back(std::move(s.call));
      }
    }
  }

  net::awaitable<void> One(StreamState& s) {
    if (o_.sse) {
      co_await OneSse(s);
      co_return;
    }
    if (o_.grpc_stream) {
      co_await OneGrpcStream(s);
      co_return;
    }
    if (o_.grpc) {
      co_await OneGrpc(s);
      co_return;
    }
    bool slow =
        o_.slow_fraction > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < o_.slow_fraction;
    report_.sent++;
    in_flight_++;
    if (slow) report_.slow_sent++;
    std::string target = Target(s);
    if (slow) target += (target.find('?') == std::string::npos ? "?" : "&") + o_.slow_query;
    const Frame* frame = frames_.empty() ? nullptr : &frames_[report_.sent % frames_.size()];
    const std::string& body = frame ? frame->body : o_.body;
    const std::string& method = frame ? kPost : o_.method;
    std::string req = absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: ", o_.host, "\r\n",
                                   o_.api_key.empty() ? "" : "X-Api-Key: " + o_.api_key + "\r\n",
                                   body.empty() && method == "GET"
                                       ? ""
                                       : absl::StrCat("Content-Length: ", body.size(), "\r\n"),
                                   frame ? "Content-Type: application/json\r\n" : "", "\r\n", body);
    auto sent_at = Clock::now();
    if (!slow) Out(s, sent_at);
    std::string failure;
    error_code ec;
    bool keep = false;
    std::string node;
    beast::flat_buffer buf;
    std::optional<http::response_parser<http::string_body>> p;
    std::unique_ptr<beast::tcp_stream> c = co_await Send(s, req, true, buf, p, ec, &failure);
    if (c) {
      if (ec == beast::error::timeout) {
        failure = "timeout";
      } else if (ec) {
        failure = "read: " + ec.message();
      } else {
        node = std::string(p->get()["X-Gpuha-Node"]);
        if (p->get().result_int() != 200) {
          failure = absl::StrCat("http_", p->get().result_int());
          // The router's own errors say why in X-Gpuha-Error.
          if (auto why = p->get()["X-Gpuha-Error"]; !why.empty()) failure += " " + std::string(why);
        } else if (frame != nullptr) {
          auto got = worker::ParseInferResponse(p->get().body());
          if (!got.ok() || !SameAnswer(*got, frame->expected)) failure = "wrong answer";
        }
        keep = failure.empty() && p->keep_alive();
      }
    }
    auto now = Clock::now();
    in_flight_--;
    if (!slow) Back(s, failure, now);
    if (slow && failure.empty()) report_.slow_ok++;
    Record(s, sent_at, now, failure, node, keep ? std::move(c) : nullptr,
           keep ? KeptUntil(p->get()) : Clock::time_point::max());
  }

  net::awaitable<void> Progress() {
    net::steady_timer t(ioc_);
    while (Clock::now() < end_ || in_flight_ > 0) {
      t.expires_after(std::chrono::seconds(1));
      error_code ec;
      co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
      if (o_.progress) {
        std::fprintf(stderr, "\r[%5.1fs] sent %llu  ok %llu  failed %llu  in flight %lld   ",
                     Ms(Clock::now() - start_) / 1000, (unsigned long long)report_.sent,
                     (unsigned long long)report_.ok, (unsigned long long)report_.failed,
                     (long long)in_flight_);
      }
      if (Clock::now() > end_ + o_.timeout + std::chrono::seconds(1)) break;
    }
    if (o_.progress) std::fprintf(stderr, "\n");
    // Whatever is still open after the grace is over is left to die.
    ioc_.stop();
  }

  LoadReport Run() {
    start_ = Clock::now();
    end_ = start_ + o_.duration;
    for (auto& s : streams_) s->last_answer = start_;
    if (o_.rate > 0) {
      net::co_spawn(ioc_, OpenLoop(), net::detached);
    } else {
      for (int c = 0; c < o_.concurrency; ++c) net::co_spawn(ioc_, ClosedLoop(c), net::detached);
    }
    net::co_spawn(ioc_, Progress(), net::detached);
    ioc_.run();
    // gRPC calls still out are cancelled, and their callbacks waited for:
    // none may post to this loop once it is gone.
    if (calls_) calls_->CancelAndWait();
    if (in_flight_ > 0) {  // still unanswered after the timeout's grace
      report_.failed += static_cast<uint64_t>(in_flight_);
      report_.failures["no answer"] += static_cast<uint64_t>(in_flight_);
    }
    report_.seconds = Ms(std::min(Clock::now(), end_) - start_) / 1000;
    std::sort(latencies_.begin(), latencies_.end());
    auto pct = [&](double p) {
      if (latencies_.empty()) return 0.0;
      return latencies_[std::min(latencies_.size() - 1, size_t(p * double(latencies_.size())))];
    };
    report_.p50_ms = pct(0.5);
    report_.p99_ms = pct(0.99);
    report_.p999_ms = pct(0.999);
    report_.max_ms = latencies_.empty() ? 0 : latencies_.back();
    report_.sse = o_.sse;
    if (o_.sse) {
      auto pct_of = [](std::vector<double>& v, double p) {
        if (v.empty()) return 0.0;
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
      };
      report_.ttft_p50_ms = pct_of(ttfts_, 0.5);
      report_.ttft_p99_ms = pct_of(ttfts_, 0.99);
      report_.gap_p50_ms = pct_of(gaps_, 0.5);
      report_.gap_p99_ms = pct_of(gaps_, 0.99);
      report_.gap_p999_ms = pct_of(gaps_, 0.999);
      report_.gap_max_ms = gaps_.empty() ? 0 : gaps_.back();
    }
    for (auto& s : streams_) {
      // A stream silent at the end counts the silence up to the end.
      s->report.max_gap_ms = std::max(s->report.max_gap_ms, Ms(end_ - s->last_answer));
      report_.max_gap_ms = std::max(report_.max_gap_ms, s->report.max_gap_ms);
      if (s->stalled_since && *s->stalled_since < end_) {  // still waiting at the end
        s->report.max_stall_ms = std::max(s->report.max_stall_ms, Ms(end_ - *s->stalled_since));
      }
      report_.max_stall_ms = std::max(report_.max_stall_ms, s->report.max_stall_ms);
      report_.streams.push_back(s->report);
    }
    return report_;
  }

 private:
  // The gRPC channel's target: the router, or the list of them in gRPC's
  // own form ("ipv4:A:P,B:P"; RunLoad checked that they are all one family).
  std::string GrpcTarget() const {
    if (routers_.size() == 1) return absl::StrCat(o_.host, ":", o_.port);
    std::vector<std::string> each;
    for (const tcp::endpoint& e : routers_) {
      each.push_back(e.address().is_v6()
                         ? absl::StrCat("[", e.address().to_string(), "]:", e.port())
                         : absl::StrCat(e.address().to_string(), ":", e.port()));
    }
    return absl::StrCat(routers_[0].address().is_v6() ? "ipv6:" : "ipv4:",
                        absl::StrJoin(each, ","));
  }

  static inline const std::string kPost = "POST";
  const LoadOptions& o_;
  net::io_context& ioc_;
  std::vector<tcp::endpoint> routers_;  // o_.host:o_.port, then o_.more_routers
  size_t router_ = 0;                   // the one new connections go to
  std::vector<Frame> frames_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<StreamState>> streams_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;  // grpc
  std::unique_ptr<GrpcCalls> calls_;
  std::vector<double> latencies_;
  std::vector<double> ttfts_, gaps_;  // sse
  LoadReport report_;
  int64_t in_flight_ = 0;
  Clock::time_point start_, end_;
};

}  // namespace

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& o) {
  if (o.streams < 1) return absl::InvalidArgumentError("--streams: must be at least 1");
  if (o.rate < 0) return absl::InvalidArgumentError("--rate: must not be negative");
  if (o.rate == 0 && o.concurrency < 1) {
    return absl::InvalidArgumentError("--concurrency: must be at least 1 in closed loop");
  }
  if (o.infer && (o.image_side < 1 || o.image_side > 1024)) {
    return absl::InvalidArgumentError("--image-side: must be 1 to 1024");
  }
  if (o.slow_fraction < 0 || o.slow_fraction > 1) {
    return absl::InvalidArgumentError("--slow-fraction: must be 0 to 1");
  }
  if (o.sse && (o.max_tokens < 1 || o.max_tokens > worker::kLlmMaxTokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens: must be 1 to ", worker::kLlmMaxTokens));
  }
  if (o.sse && o.infer) return absl::InvalidArgumentError("--protocol sse and --infer: pick one");
  if ((o.grpc || o.grpc_stream) && o.slow_fraction > 0) {
    return absl::InvalidArgumentError("--slow-fraction: not with --protocol grpc or grpc-stream");
  }
  if (o.grpc && o.grpc_stream) {
    return absl::InvalidArgumentError("grpc and grpc_stream: pick one");
  }
  error_code ec;
  const net::ip::address first = net::ip::make_address(o.host, ec);
  if (ec) return absl::InvalidArgumentError("--target: host must be an IP address");
  for (const common::HostPort& r : o.more_routers) {
    const net::ip::address a = net::ip::make_address(r.host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--target: '", r.host, "' is not an IP address (each router's must be)"));
    }
    if (a.is_v6() != first.is_v6()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--target: '", r.str(), "': every router on one list is IPv4, or every one IPv6"));
    }
    if (r.port == 0)
      return absl::InvalidArgumentError(absl::StrCat("--target: '", r.str(), "': no port"));
  }
  net::io_context ioc(1);
  Runner r(o, ioc);
  return r.Run();
}

std::string LoadReport::Json() const {
  std::vector<std::string> f, s, b;
  for (const auto& [reason, n] : failures) f.push_back(absl::StrFormat("\"%s\":%d", reason, n));
  for (const auto& [node, n] : served_by) b.push_back(absl::StrFormat("\"%s\":%d", node, n));
  for (const StreamReport& st : streams) {
    s.push_back(absl::StrFormat(
        R"({"stream":"%s","ok":%d,"failed":%d,"max_gap_ms":%.3f,"max_stall_ms":%.3f})", st.stream,
        st.ok, st.failed, st.max_gap_ms, st.max_stall_ms));
  }
  return absl::StrFormat(
      R"({"sent":%d,"ok":%d,"failed":%d,"failures":{%s},"stale_retries":%d,"router_failovers":%d,)"
      R"("slow_sent":%d,"slow_ok":%d,)"
      R"("latency_ms":{"p50":%.3f,"p99":%.3f,"p999":%.3f,"max":%.3f},"max_gap_ms":%.3f,)"
      R"("max_stall_ms":%.3f,"seconds":%.3f,"served_by":{%s},%s"streams":[%s]})",
      sent, ok, failed, absl::StrJoin(f, ","), stale_retries, router_failovers, slow_sent, slow_ok,
      p50_ms, p99_ms, p999_ms, max_ms, max_gap_ms, max_stall_ms, seconds, absl::StrJoin(b, ","),
      sse ? absl::StrFormat(
                R"("sse":{"tokens":%d,"ttft_ms":{"p50":%.3f,"p99":%.3f},)"
                R"("gap_ms":{"p50":%.3f,"p99":%.3f,"p999":%.3f,"max":%.3f},)"
                R"("continued":%d,"continued_on_token_ids":%d,"continued_by_text":%d},)",
                tokens, ttft_p50_ms, ttft_p99_ms, gap_p50_ms, gap_p99_ms, gap_p999_ms, gap_max_ms,
                continued, continued_on_ids, continued_by_text)
          : std::string(),
      absl::StrJoin(s, ","));
}

std::string LoadReport::Text() const {
  std::string out = absl::StrFormat(
      "sent %d  ok %d  failed %d  (%.1f s, %.0f req/s answered)\n"
      "latency ms: p50 %.2f  p99 %.2f  p999 %.2f  max %.2f\n"
      "longest stretch with no answer, worst stream: %.1f ms\n"
      "longest stall (a request out, no answer; slow requests aside), worst stream: %.1f ms\n",
      sent, ok, failed, seconds, seconds > 0 ? double(ok) / seconds : 0, p50_ms, p99_ms, p999_ms,
      max_ms, max_gap_ms, max_stall_ms);
  if (slow_sent > 0)
    out += absl::StrFormat("slow requests: %d sent, %d answered ok\n", slow_sent, slow_ok);
  if (stale_retries > 0) {
    out += absl::StrFormat(
        "re-sent on a new connection after a kept-alive one closed with nothing back: %d\n",
        stale_retries);
  }
  if (router_failovers > 0) {
    out += absl::StrFormat("moved on to the next router (a refused connect, or nothing back): %d\n",
                           router_failovers);
  }
  if (sse) {
    out += absl::StrFormat(
        "tokens %d  time to first token ms: p50 %.1f  p99 %.1f\n"
        "gap between tokens ms: p50 %.1f  p99 %.1f  p999 %.1f  max %.1f\n"
        "answers continued by the router %d (on their token IDs %d, by text %d)\n",
        tokens, ttft_p50_ms, ttft_p99_ms, gap_p50_ms, gap_p99_ms, gap_p999_ms, gap_max_ms,
        continued, continued_on_ids, continued_by_text);
  }
  for (const auto& [reason, n] : failures)
    out += absl::StrFormat("  failed: %-30s %d\n", reason, n);
  for (const auto& [node, n] : served_by) out += absl::StrFormat("  served by %-20s %d\n", node, n);
  return out;
}

}  // namespace gpuha::load
