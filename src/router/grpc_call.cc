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
  Loop& L = c.L;
  const H2Headers& request = c.request;
  c.path = std::string(H2Find(request, ":path"));
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
  Identity who =
      Identify(*L.tenants, ApiKeyOf(H2Find(request, "authorization"), H2Find(request, "x-api-key")),
               &c.conn->key_cache);
  if (!who.tenant) {
    c.Answer(who.refusal->reason, who.refusal->detail);
    return false;
  }
  c.tenant = std::move(who.tenant);
  StreamRef ref = ExtractStream(H2Find(request, "x-gpuha-stream"), c.path);
  if (ref.bad) {
    c.Answer(Reason::kBadStream, "x-gpuha-stream must be 1-128 of [A-Za-z0-9._:-]");
    return false;
  }
  if (ref.stream.empty()) ref.stream = c.tenant->default_stream;
  if (ref.stream.empty()) {
    c.Answer(Reason::kNoStream, "the call names no stream: send x-gpuha-stream metadata");
    return false;
  }
  c.stream_id = ref.stream;
  RefreshRoutes(L);
  c.routes = L.routes;
  if (std::optional<Refusal> r = ChooseUpstreams(L, c.routes.get(), *c.tenant, c.stream_id,
                                                 L.clock.Now(), &c.order, &c.entry)) {
    c.Answer(r->reason, r->detail);
    return false;
  }
  if (std::optional<Refusal> r = CheckRate(*c.tenant, L.clock.Now())) {
    c.Answer(r->reason, r->detail);
    return false;
  }
  // Over its quota it is refused before it earns the retry budget
  // anything, as an HTTP/1.1 request is.
  c.quota.emplace(*c.tenant);
  if (c.quota->over()) {
    c.Answer(Reason::kOverQuota, QuotaSlot::Refused().detail);
    return false;
  }
  c.BindGrpc();
  L.retry_budget.Deposit(L.now);
  return true;
}

// One unary gRPC call, from its whole request to its whole answer.
awaitable<void> HandleCall(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id) {
  const RouterConfig& config = L.config;
  CallCount count{*conn};  // counted when it was spawned
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.requests);
  Inc(L.stats.grpc_calls);
  CallCtx c(L, conn, id);
  c.request = std::move(s->headers);
  const std::string body = std::move(s->body);
  if (!Admit(c)) co_return;
  InFlight in_flight(L.stats.in_flight);
  bool hung = false, unavailable = false;
  // Attempts are counted apart from the place in the order, which starts
  // again when the order is chosen anew.
  size_t attempt = 0;
  for (size_t i = 0; i < c.order.size(); ++i, ++attempt) {
    UpstreamState& up = *c.order[i];
    if (!c.MayRetry(attempt, hung, unavailable)) co_return;
    hung = unavailable = false;
    if (!c.ServesGrpc(up)) continue;
    const Clock::time_point now = Clock::now();
    if (now >= c.deadline) break;
    c.attempts = static_cast<int>(attempt + 1);
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
      c.last_failure = absl::StrCat(up.node, ": ", call.why);
      hung = call.hung_cancel;
      if (call.timed_out && c.DeadlinePassed()) break;
      if (i == 0 && c.order.size() > 1) {
        L.sticky.Stick(c.stream_id, c.entry->primary.address, c.entry->standby.address,
                       L.clock.Now());
      }
      // The routes moved since it was admitted (a standby fenced
      // meanwhile, or one given to a call admitted with its primary
      // alone): where its route points now instead, whether or not its
      // admission left it a next upstream.
      if (c.RoutesMoved()) {
        if (!c.Rechoose(&up)) co_return;
        i = static_cast<size_t>(-1);  // the loop's ++i: the fresh order's first
      }
      continue;
    }
    const std::string_view status = H2Find(call.headers, ":status");
    if (status != "200") {
      UpstreamAnswered(L, up, true, call.answered_at, call.answered_at - call.waiting_since);
      c.last_failure = absl::StrCat(up.node, ": answered HTTP status ", std::string(status));
      continue;
    }
    const std::string_view grpc_status = GrpcStatusOf(call);
    Inc(L.stats.upstream_class[2]);
    UpstreamAnswered(L, up, ServerError(grpc_status), call.answered_at,
                     call.answered_at - call.waiting_since);
    if (RetryableStatus(grpc_status) && config.retry_5xx && i + 1 < c.order.size()) {
      unavailable = true;
      c.last_failure = absl::StrCat(up.node, ": grpc-status ", std::string(grpc_status), ": ",
                                    std::string(H2Find(call.trailers, "grpc-message")),
                                    std::string(H2Find(call.headers, "grpc-message")));
      continue;
    }
    conn->h2.Respond(id, RelayHeaders(call.headers), std::move(call.data),
                     RelayTrailers(call.trailers));
    conn->Kick();
    co_return;
  }
  c.AllFailed();
}

}  // namespace gpuha::router::grpc_proxy
