// A unary gRPC call through the router: admitted as an HTTP/1.1 request
// is, sent whole to its upstreams in order, and answered by the first that
// answers.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include "router/grpc_call.h"

#include "common/log.h"

namespace gpuha::router::grpc_proxy {

bool Admit(CallCtx& c) {
  const H2Headers& request = c.request;
  c.path = H2Find(request, ":path");
  if (H2Find(request, ":method") != "POST" || c.path.empty() || c.path[0] != '/') {
    c.Answer(Reason::kBadRequest, "a gRPC call is a POST to /package.Service/Method");
    return false;
  }
  std::chrono::milliseconds timeout{};
  if (std::string_view t = H2Find(request, "grpc-timeout"); !t.empty()) {
    absl::StatusOr<std::chrono::milliseconds> parsed = ParseGrpcTimeout(t);
    if (!parsed.ok()) {
      c.Answer(Reason::kBadRequest, std::string(parsed.status().message()));
      return false;
    }
    // Up to a day: a longer one is no deadline in practice, and a steady
    // clock's time point holds only about 292 years of nanoseconds.
    timeout = std::min<std::chrono::milliseconds>(*parsed, std::chrono::hours(24));
    c.client_deadline = true;
  }
  // Without the client's deadline, each attempt gets response_timeout.
  c.deadline = c.client_deadline ? Clock::now() + timeout : Clock::time_point::max();
  if (std::optional<Refusal> r = c.pipe.Admit(
          {.api_key = ApiKeyOf(H2Find(request, "authorization"), H2Find(request, "x-api-key")),
           .stream_header = H2Find(request, "x-gpuha-stream"),
           .target = c.path,
           .key_cache = &c.conn->key_cache,
           .grpc = true})) {
    c.Answer(*r);
    return false;
  }
  return true;
}

// One unary gRPC call, from its whole request to its whole answer.
awaitable<void> HandleCall(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id) {
  const RouterConfig& config = L.config;
  CallCount count{*conn};  // counted when it was spawned
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.grpc_calls);
  CallCtx c(L, conn, id);
  c.request = std::move(s->headers);
  const std::string body = std::move(s->body);
  if (!Admit(c)) co_return;
  std::optional<Refusal> refused;
  while (UpstreamState* next = c.pipe.Next(&refused)) {
    UpstreamState& up = *next;
    if (!c.ServesGrpc(up)) continue;
    const Clock::time_point now = Clock::now();
    if (now >= c.deadline) break;
    H2Call call(L);
    ClientHook hook(*conn, id, call);
    co_await H2Send(L, up, c.UpstreamHeaders(up), body,
                    std::min(c.deadline, now + config.limits.response_timeout), call);
    if (call.client_gone || conn->closed) {
      Inc(L.stats.client_aborts);
      co_return;
    }
    if (call.response_too_large) {
      c.Answer(Reason::kBodyTooLarge, absl::StrCat(up.node, ": ", call.why));
      co_return;
    }
    if (call.failed) {
      c.pipe.Failed({.why = call.why,
                     .hung = call.hung_cancel,
                     .timeout = c.DeadlinePassed(),
                     .client_deadline = call.timed_out && c.DeadlinePassed()});
      if (call.timed_out && c.DeadlinePassed()) break;
      continue;
    }
    const std::string_view status = H2Find(call.headers, ":status");
    if (status != "200") {
      UpstreamAnswered(L, up, true, call.answered_at, call.answered_at - call.waiting_since);
      c.pipe.Failed(
          {.why = absl::StrCat("answered HTTP status ", std::string(status)), .answered = true});
      continue;
    }
    const std::string_view grpc_status = GrpcStatusOf(call);
    Inc(L.stats.upstream_class[2]);
    UpstreamAnswered(L, up, ServerError(grpc_status), call.answered_at,
                     call.answered_at - call.waiting_since);
    if (RetryableStatus(grpc_status) && config.retry_5xx && c.pipe.HasNext()) {
      c.pipe.Failed({.why = absl::StrCat("grpc-status ", std::string(grpc_status), ": ",
                                         std::string(H2Find(call.trailers, "grpc-message")),
                                         std::string(H2Find(call.headers, "grpc-message"))),
                     .answered = true,
                     .server_error = true});
      continue;
    }
    conn->h2.Respond(id, RelayHeaders(std::move(call.headers)), std::move(call.data),
                     RelayTrailers(std::move(call.trailers)));
    conn->Kick();
    co_return;
  }
  c.AllFailed(refused);
}

}  // namespace gpuha::router::grpc_proxy
