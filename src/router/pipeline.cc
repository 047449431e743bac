#include "router/pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpuha::router {
namespace {

// The upstreams to try for a request, in order: the stream's primary and
// standby (the sticky rule decides which first). Down and hung upstreams are
// left out. Another tenant's stream is "unknown": its existence does not
// leak.
std::optional<Refusal> ChooseUpstreams(Loop& L, const RouteTable* routes, const Tenant& tenant,
                                       const std::string& stream_id, TimePoint now,
                                       UpstreamOrder<UpstreamState>* order,
                                       const RouteEntry** entry) {
  const RouteEntry* e = routes ? routes->Find(stream_id) : nullptr;
  if (e == nullptr || (L.tenants->auth_required() && e->tenant != tenant.name)) {
    return Refusal{Reason::kUnknownStream, "no such stream"};
  }
  if (e->primary.empty()) {
    return Refusal{Reason::kNoCapacity, "the stream is not placed: the cluster is over capacity",
                   1};
  }
  *entry = e;
  UpstreamState* primary = &FindUpstream(L, e->primary);
  UpstreamState* standby = e->standby.empty() ? nullptr : &FindUpstream(L, e->standby);
  for (UpstreamState* up : {primary, standby}) {
    if (up != nullptr && up->named && up->dns_generation != L.shared.dns->generation()) {
      LookUpName(L, *up);
    }
  }
  bool stuck =
      L.sticky.Stuck(stream_id, e->primary.address, e->standby.address, primary->usable(now), now);
  *order = StreamOrder(primary, standby, stuck, now);
  DropUnfit(*order, now);
  if (order->empty()) {
    // Never silent: a name that does not resolve says so.
    if (!primary->resolvable && (standby == nullptr || !standby->resolvable)) {
      return Refusal{Reason::kUpstreamUnresolved,
                     standby == nullptr
                         ? absl::StrCat("upstream ", e->primary.address, " does not resolve")
                         : absl::StrCat("upstreams ", e->primary.address, " and ",
                                        e->standby.address, " do not resolve")};
    }
    return Refusal{Reason::kNoUpstream, "every upstream of the stream is down or hung", 1};
  }
  return std::nullopt;
}

}  // namespace

Pipeline::Pipeline(Loop& L) : L_(L), started_(L.clock.Now()) { Inc(L.stats.requests); }

Pipeline::~Pipeline() {
  const common::Duration took = L_.clock.Now() - started_;
  if (!streamed_) L_.latency.Observe(tenant_name(), status_, took);
  if (attempts_ > 0) L_.requests.Request(attempts_, took);
}

std::optional<Refusal> Pipeline::Admit(const Ask& ask) {
  Identity who = Identify(*L_.tenants, ask.api_key, ask.key_cache);
  if (!who.tenant) return std::move(*who.refusal);
  tenant_ = std::move(who.tenant);
  StreamRef ref = ExtractStream(ask.stream_header, ask.target);
  if (ref.bad) {
    return Refusal{Reason::kBadStream,
                   ask.grpc ? "x-gpuha-stream must be 1-128 of [A-Za-z0-9._:-]"
                            : "stream id must be 1-128 of [A-Za-z0-9._:-], and the header and "
                              "path must agree"};
  }
  if (ref.stream.empty()) ref.stream = tenant_->default_stream;
  if (ref.stream.empty()) {
    return Refusal{Reason::kNoStream,
                   ask.grpc ? "the call names no stream: send x-gpuha-stream metadata"
                            : "the request names no stream: use /streams/ID/... or the "
                              "X-Gpuha-Stream header"};
  }
  stream_id_ = std::move(ref.stream);
  target_ = std::move(ref.target);
  RefreshRoutes(L_);
  routes_ = L_.routes;
  const TimePoint now = L_.clock.Now();
  if (std::optional<Refusal> r =
          ChooseUpstreams(L_, routes_.get(), *tenant_, stream_id_, now, &order_, &entry_)) {
    return r;
  }
  if (std::optional<Refusal> r = CheckRate(*tenant_, now)) return r;
  // Over its quota it is refused before it earns the retry budget anything.
  quota_.emplace(*tenant_);
  if (quota_->over()) return QuotaSlot::Refused();
  L_.retry_budget.Deposit(L_.now);
  in_flight_.emplace(L_.stats.in_flight);
  return std::nullopt;
}

UpstreamState* Pipeline::Next(std::optional<Refusal>* refused) {
  if (!HasNext()) return nullptr;
  if (attempts_ > 0) {
    if (!MayResend(L_, hung_)) {
      *refused = Refusal{Reason::kRetryBudget,
                         absl::StrCat("retry budget exhausted after: ", last_failure_), 1};
      return nullptr;
    }
    Inc(L_.stats.retries);
    if (hung_) Inc(L_.stats.hung_resends);
    if (server_error_) Inc(L_.stats.retries_5xx);
  }
  hung_ = server_error_ = lived_ = false;
  ++attempts_;
  return order_[tried_++];
}

void Pipeline::Failed(Failure f) {
  const UpstreamState* up = order_[tried_ - 1];
  last_failure_ = absl::StrCat(up->node, ": ", f.why);
  hung_ = f.hung;
  server_error_ = f.server_error;
  any_timeout_ = any_timeout_ || f.timeout;
  if (f.client_deadline) return;
  if (lived_) {
    // An answer lasts: those tried before it began are forgotten, and
    // where it goes on is chosen again from the routes and health of now
    // (a standby down when it began may be back, the stream may have
    // moved). Where the routes of now refuse the stream, it ends with
    // that refusal, not on an upstream of routes gone by.
    order_.erase(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(tried_ - 1));
    tried_ = 1;
    Rechoose();
    if (refused_now_) order_.resize(tried_);
  } else if (!f.answered && RoutesMoved()) {
    // The routes moved while it waited (its standby fenced meanwhile, an
    // XID flood's second node; or, admitted with its primary alone, a
    // standby given since): it goes where its route points now, whether
    // or not its admission left it a next upstream. Where the routes of
    // now refuse the stream, the order it was admitted with is kept.
    Rechoose();
  }
  // The stream's primary failed: its next requests go to its standby
  // first for a while (StickyFailover).
  if (up->address == entry_->primary.address && !entry_->standby.empty() && HasNext()) {
    L_.sticky.Stick(stream_id_, entry_->primary.address, entry_->standby.address, L_.clock.Now());
  }
}

Refusal Pipeline::Exhausted() const {
  if (refused_now_) {
    return {refused_now_->reason,
            absl::StrCat(refused_now_->detail, "; the request broke: ", last_failure_),
            refused_now_->retry_after_s};
  }
  return {any_timeout_ ? Reason::kUpstreamTimeout : Reason::kUpstreamFailed,
          absl::StrCat("every upstream failed; last: ", last_failure_)};
}

bool Pipeline::RoutesMoved() { return !RoutesCurrent(); }

// The upstreams after those tried, anew from the routes and health of now;
// those tried stay tried.
void Pipeline::Rechoose() {
  RefreshRoutes(L_);
  std::shared_ptr<const RouteTable> now = L_.routes;
  UpstreamOrder<UpstreamState> fresh;
  const RouteEntry* e = nullptr;
  if (std::optional<Refusal> r =
          ChooseUpstreams(L_, now.get(), *tenant_, stream_id_, L_.clock.Now(), &fresh, &e)) {
    refused_now_ = std::move(r);
    return;
  }
  refused_now_.reset();
  routes_ = std::move(now);
  entry_ = e;
  order_.resize(tried_);
  for (UpstreamState* u : fresh) {
    if (std::find(order_.begin(), order_.end(), u) == order_.end()) order_.push_back(u);
  }
}

}  // namespace gpuha::router
