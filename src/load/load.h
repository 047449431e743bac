// The load generator behind `gpuha load`: N streams through the router for T
// seconds, open loop (a fixed request rate, so failover gaps show instead of
// being absorbed by a slowed-down client) or closed loop (C clients back to
// back). Every answer is checked; the report counts failures by reason, the
// latency distribution and, per stream, the longest stretch with no answer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/net_util.h"

namespace gpuha::load {

// One answered (or failed) request, for callers that follow answers live
// (`gpuha demo` times "first request served by the standby" from these).
struct Answer {
  const std::string* stream = nullptr;
  int64_t unix_nanos = 0;  // when the answer (or the failure) arrived
  bool ok = false;
  std::string node;     // X-Gpuha-Node of the server that answered, if any
  std::string failure;  // reason when !ok
};

struct LoadOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  // More routers after host:port, a client-side list as gRPC's balancing
  // keeps one: connections go to the router in use, and to the next in
  // turn once it refuses one; a request that got no byte back from it is
  // sent again to the next (it died or was killed with the request in
  // hand). gRPC: one channel over the list (pick_first). IP addresses only.
  std::vector<common::HostPort> more_routers;
  // A request that got nothing back is sent again (a kept-alive connection
  // closed as it went out, a router gone with it in hand). False: it
  // fails, as a client that never retries sees it (to compare proxies'
  // restarts with one client).
  bool resend = true;
  int streams = 20;
  std::string stream_prefix = "cam-";  // streams are PREFIX0 .. PREFIX{N-1}
  double rate = 1000;                  // requests/s in all; 0: closed loop
  int concurrency = 16;                // closed loop: clients
  std::chrono::milliseconds duration{10000};
  std::chrono::milliseconds timeout{30000};  // per request
  std::string api_key;
  std::string path = "/v2/models/m/infer";  // sent as /streams/ID<path>
  bool direct = false;  // sent as <path> alone: straight to a server, for a baseline
  std::string method = "GET";
  std::string body;
  double slow_fraction = 0;  // this share of requests gets slow_query appended
  std::string slow_query;    // e.g. "delay_ms=1500"
  bool progress = true;      // a progress line on stderr every second
  // KServe v2 inference on the reference worker's "cv" model: each request
  // carries a generated image and previous frame (POST, JSON tensors), and
  // each answer's histogram, brightness and motion are checked against the
  // model run here. A wrong answer is a failure ("wrong answer").
  bool infer = false;
  int image_side = 16;  // infer: images are side x side x 3
  // LLM token streams: each request is a streamed completion (SSE) of the
  // worker's language model, with a prompt of its own; the whole answer is
  // checked against the model run here (text, finish reason, usage) and
  // each token is timed. A cut, empty, duplicated or wrong answer, or one
  // ended by an error event, is a failure that says which.
  bool sse = false;
  int max_tokens = 64;
  // sse: the model asked for ("gpuha-tiny-bpe": the tokenizer model, whose
  // answers are also checked token ID for token ID, return_token_ids
  // asked); every other request a chat (to the chat route beside `path`);
  // every other pair seeded (seed and temperature set).
  std::string llm_model = "gpuha-tiny";
  bool llm_chat = false;
  bool llm_seeded = false;
  // sse: every fourth request held to a JSON schema (response_format): a
  // whole answer must be a JSON document of it; one the router could not
  // continue must end with the error event that names its format (a
  // failure, named so: "structured: ended by the error event").
  bool llm_structured = false;
  // KServe v2 gRPC: each request is a unary ModelInfer call of the "cv"
  // model over HTTP/2 (one channel, calls multiplexed), its stream named in
  // x-gpuha-stream metadata and its key in x-api-key; every answer checked
  // as `infer` checks them. A status other than OK is a failure named by
  // its code, and by the router's reason when the router made the answer
  // ("grpc UNAVAILABLE no_capacity").
  bool grpc = false;
  // KServe v2 gRPC streams: each load stream is one ModelStreamInfer call
  // (bidirectional, as a camera pipeline streams frames), and each request
  // a message on it, checked as `grpc` checks answers and also by its id:
  // every message must get exactly one answer, in order ("answer out of
  // order or duplicated"). A call that ends fails the messages it had out
  // ("grpc stream UNAVAILABLE"), and the stream's next message opens a new
  // one; a message unanswered after `timeout` gives its call up.
  bool grpc_stream = false;
  std::function<void(const Answer&)> on_answer;  // called on the load thread
  // When set, load stops early once it turns true (checked before each send).
  const std::atomic<bool>* stop = nullptr;
};

struct StreamReport {
  std::string stream;
  uint64_t ok = 0;
  uint64_t failed = 0;
  double max_gap_ms = 0;  // longest stretch between answers while load ran
  // Longest time the stream had a request out (not a deliberately slow one)
  // with no answer coming back, failures included: what a failover cost it.
  // Unlike max_gap_ms it has no floor from the holes slow requests leave in
  // the stream of answers.
  double max_stall_ms = 0;
};

struct LoadReport {
  uint64_t sent = 0;
  uint64_t ok = 0;
  uint64_t failed = 0;
  std::map<std::string, uint64_t> failures;  // reason -> count
  uint64_t slow_sent = 0, slow_ok = 0;
  // Requests re-sent once on a new connection because the kept-alive one
  // they went out on closed with nothing back (HTTP/1.1's keep-alive race:
  // the server closed it idle as the request was written), and gRPC stream
  // messages sent again on a new call because the router ended theirs for
  // its drain without taking them. Not failures.
  uint64_t stale_retries = 0;
  // Times the load moved on to the next router (more_routers): a refused
  // connect, or a new connection closed with nothing back (its request is
  // re-sent there). Not failures.
  uint64_t router_failovers = 0;
  double p50_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0;
  double max_gap_ms = 0;    // worst stream
  double max_stall_ms = 0;  // worst stream
  double seconds = 0;
  std::vector<StreamReport> streams;
  std::map<std::string, uint64_t> served_by;  // node (X-Gpuha-Node) -> answers
  // sse: tokens received, time to first token, and the gaps between tokens
  // of one answer (max_stall_ms is then the longest of either).
  bool sse = false;
  uint64_t tokens = 0;
  // Answers that came whole and marked as continued by the router
  // (gpuha_continuation), and of those, on their token IDs and by text
  // (the rest were asked again from the start: none had been delivered).
  uint64_t continued = 0, continued_on_ids = 0, continued_by_text = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double gap_p50_ms = 0, gap_p99_ms = 0, gap_p999_ms = 0, gap_max_ms = 0;
  std::string Json() const;
  std::string Text() const;
};

[[nodiscard]] absl::StatusOr<LoadReport> RunLoad(const LoadOptions& o);

}  // namespace gpuha::load
