// Pipeline: one request from its admission to its answer, whatever the
// client's protocol, in the manner of Envoy's router filter, which serves
// every codec. It holds what every request shares: the tenant (by its key,
// within its rate and quota), the stream and its route, the order of its
// upstreams, the retry budget that pays for each attempt after the first,
// the sticky rule, the re-choice when the routes move while it waits, the
// answer when every upstream failed, and its count in the latency and
// attempt histograms.
//
// The codecs sit at its edges and each runs one attempt on one upstream:
// HTTP/1.1 (client_conn.cc and exchange.cc, with the SSE continuation;
// REST and SSE over HTTP/2 come through them, h2_rest.h), a unary gRPC
// call (grpc_call.cc) and a streaming one (grpc_stream.cc). Each tells the
// pipeline how its attempt ended:
//
//   Pipeline p(L);
//   if (std::optional<Refusal> r = p.Admit({api_key, stream_header, path, &cache})) ...
//   std::optional<Refusal> refused;
//   while (UpstreamState* up = p.Next(&refused)) {
//     ... one attempt on *up; answered: return ...
//     p.Failed({.why = "connect: refused"});
//   }
//   answer(refused ? *refused : p.Exhausted());
//
// Internal to the router. Thread-safety: a request lives on one loop.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "router/admission.h"
#include "router/loop.h"

namespace gpuha::router {

// What admission reads of a request, whatever its codec.
struct Ask {
  std::string_view api_key{};
  std::string_view stream_header{};  // X-Gpuha-Stream, or the gRPC metadata
  std::string_view target{};         // the normalized HTTP target, or a call's :path
  KeyCache* key_cache = nullptr;     // the client connection's
  bool grpc = false;                 // how a refusal says to name the stream
};

// How one attempt failed, as its codec saw it.
struct Failure {
  std::string why{};
  // A verdict cancelled it (hung, stalled): its re-send is failover, not
  // rationed by the retry budget.
  bool hung = false;
  // The upstream answered an error that was set aside for the next one (an
  // HTTP 5xx, a gRPC UNAVAILABLE): that next one is the one it was
  // admitted with, even if the routes moved (re-choosing could leave none,
  // and the set-aside answer would become the router's).
  bool answered = false;
  bool server_error = false;  // that answer was a server's error (counted as a 5xx re-send)
  bool timeout = false;       // the client's time ran out: the final answer says so
  // The client's own deadline ended it (grpc-timeout): it says nothing of
  // the upstream, so the stream does not stick to its standby for it and
  // its upstreams are not chosen again.
  bool client_deadline = false;
};

class Pipeline {
 public:
  // Counts the request.
  explicit Pipeline(Loop& L);
  // Observes its latency (unless streamed) and its attempts.
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Admission, in order: the tenant by its key, the stream (metadata or
  // path, else the tenant's default), its upstreams from the routes of now,
  // the tenant's rate, its quota of requests in flight. nullopt: admitted,
  // counted in flight, and the retry budget credited.
  std::optional<Refusal> Admit(const Ask& ask);

  // The upstream of the next attempt; null when none is left, or when the
  // retry budget, which pays for every attempt after the first, cannot
  // (`refused` then says so).
  UpstreamState* Next(std::optional<Refusal>* refused);
  // Whether the routes its upstreams were chosen from are the newest.
  bool RoutesCurrent() {
    RefreshRoutes(L_);
    return L_.routes == routes_;
  }
  // Whether an upstream is left after the current attempt's.
  bool HasNext() const { return tried_ < order_.size(); }
  // The next attempt's upstream, while HasNext().
  const UpstreamState& upcoming() const { return *order_[tried_]; }
  // The current attempt's upstream served part of its answer (a token
  // stream, a gRPC stream's messages): the request lives there now. The
  // upstreams tried before it are forgotten, and if it fails, where the
  // answer goes on is chosen again from the routes and health of now.
  void Lived() { lived_ = true; }
  // The current attempt's upstream once more, as the same attempt: the
  // request changed, not the upstream (a field it refused taken out), so
  // no retry is counted or paid for.
  void SameAgain() {
    --tried_;
    --attempts_;
  }
  // The current attempt failed; the next may take over. Re-chooses the
  // upstreams after it when the routes moved since they were chosen
  // (unless `f.answered`), or always after an attempt that lived.
  void Failed(Failure f);
  // The answer when no upstream is left: the routes of now's refusal if a
  // re-choice met one, else every upstream failed (a timeout if the
  // client's time ran out).
  Refusal Exhausted() const;

  // The answer is whole and its last bytes are about to go to the client:
  // the request no longer counts against its tenant's quota or the
  // router's requests in flight. Before the last write, not after it: a
  // client that sends its next request on reading the answer found its
  // finished one still counted, and was refused over a quota of one.
  void Release() {
    in_flight_.reset();
    quota_.reset();
  }
  // What the client was answered (a status for the latency histogram), and
  // whether the answer is a stream that lasts as long as it is made (SSE,
  // a gRPC stream), whose duration is no request's latency.
  void Answering(int status) { status_ = status; }
  void Streaming() { streamed_ = true; }

  // Empty until admission knows it.
  const std::string& tenant_name() const { return tenant_ ? tenant_->name : kNoTenant; }
  const std::string& stream_id() const { return stream_id_; }
  // The target the upstream receives (the HTTP path, the stream's prefix kept).
  const std::string& target() const { return target_; }
  // The stream's route, from the routes the current order was chosen from.
  const RouteEntry& entry() const { return *entry_; }
  int attempts() const { return attempts_; }
  const std::string& last_failure() const { return last_failure_; }

 private:
  static inline const std::string kNoTenant;
  bool RoutesMoved();
  void Rechoose();

  Loop& L_;
  const TimePoint started_;
  std::shared_ptr<Tenant> tenant_;
  std::optional<QuotaSlot> quota_;  // after tenant_, whose count it holds
  std::optional<InFlight> in_flight_;
  std::string stream_id_;
  std::string target_;
  std::shared_ptr<const RouteTable> routes_;  // holds entry_
  const RouteEntry* entry_ = nullptr;
  // The upstreams in order; [0, tried_) were tried since the request last
  // lived somewhere, the current attempt's last among them.
  UpstreamOrder<UpstreamState> order_;
  size_t tried_ = 0;
  int attempts_ = 0;
  bool lived_ = false;  // the current attempt served part of the answer
  // The last failure, which the next attempt pays for and the final answer names.
  std::string last_failure_;
  bool hung_ = false;
  bool server_error_ = false;
  bool any_timeout_ = false;
  std::optional<Refusal> refused_now_;  // a re-choice's: the routes of now refuse the stream
  int status_ = 0;
  bool streamed_ = false;
};

}  // namespace gpuha::router
