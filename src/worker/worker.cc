#include "worker/worker.h"

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <ctime>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/listen.h"
#include "common/prometheus.h"
#include "common/query.h"
#include "worker/llm.h"
#include "worker/model.h"
#include "worker/worker_grpc.h"

namespace gpuha::worker {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

namespace {

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  bool gpu = false;  // an inference ran: the answer waits for the modelled GPU time
  int64_t extra_delay_ms = 0;
};

Reply Error(int status, const std::string& message) {
  return {status, json{{"error", message}}.dump(), "application/json", false, 0};
}

}  // namespace

absl::StatusOr<WorkerFault> ParseWorkerFault(const std::string& mode, const std::string& factor) {
  WorkerFault f;
  if (mode == "none") {
    f.mode = FaultMode::kNone;
  } else if (mode == "stuck") {
    f.mode = FaultMode::kStuck;
  } else if (mode == "errors") {
    f.mode = FaultMode::kErrors;
  } else if (mode == "cut") {
    f.mode = FaultMode::kCut;
  } else if (mode == "slow") {
    f.mode = FaultMode::kSlow;
    f.factor = 10;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: '", mode, "' is not one of none, stuck, errors, slow, cut"));
  }
  if (!factor.empty()) {
    if (f.mode != FaultMode::kSlow) {
      return absl::InvalidArgumentError("factor: only the slow mode takes a factor");
    }
    if (!absl::SimpleAtod(factor, &f.factor) || !(f.factor >= 1 && f.factor <= 1000)) {
      return absl::InvalidArgumentError(
          absl::StrCat("factor: '", factor, "' must be a number from 1 to 1000"));
    }
  }
  return f;
}

const char* FaultModeName(FaultMode m) {
  switch (m) {
    case FaultMode::kNone:
      return "none";
    case FaultMode::kStuck:
      return "stuck";
    case FaultMode::kErrors:
      return "errors";
    case FaultMode::kSlow:
      return "slow";
    case FaultMode::kCut:
      return "cut";
  }
  return "none";
}

struct Worker::Impl {
  WorkerOptions o;
  WorkerCounters counters;
  std::atomic<FaultMode> fault_mode{FaultMode::kNone};
  std::atomic<double> slow_factor{1};
  std::atomic<uint64_t> seq{0};  // completion ids

  void SetFault(const WorkerFault& f) {
    slow_factor = f.factor;
    fault_mode = f.mode;
  }

  std::string Metrics() const {
    common::PromText p;
    common::PromLabels l = {{"model", kModelName}, {"version", kModelVersion}};
    // vLLM's style: no Triton family (nv_*) at all.
    const bool triton = o.engine_metrics == EngineMetrics::kBoth;
    auto shown = [&](std::string_view family) { return triton || !family.starts_with("nv_"); };
#define GPUHA_SAMPLE(name, family, model_labels, help)                                       \
  if (shown(family)) {                                                                       \
    p.Family(family, "counter", help);                                                       \
    p.Sample(family, model_labels ? l : common::PromLabels{}, double(counters.name.load())); \
  }
    GPUHA_WORKER_COUNTERS(GPUHA_SAMPLE)
#undef GPUHA_SAMPLE
    p.Family("http_requests_total", "counter",
             "Inference answers by handler and status class, as vLLM's API server counts them.");
    for (size_t h = 0; h < std::size(WorkerCounters::kHttpHandlers); ++h) {
      for (size_t c = 0; c < std::size(WorkerCounters::kHttpClasses); ++c) {
        p.Sample("http_requests_total",
                 {{"handler", WorkerCounters::kHttpHandlers[h]},
                  {"method", "POST"},
                  {"status", WorkerCounters::kHttpClasses[c]}},
                 double(counters.http_answers[h][c].load()));
      }
    }
    if (triton) {
      p.Family("nv_inference_request_failure", "counter",
               "Failed inference requests, by reason: REJECTED (503 at capacity), CANCELED, "
               "BACKEND (the engine failed), OTHER (bad input).");
      for (auto [reason, n] : {std::pair{"REJECTED", &counters.failure_rejected},
                               {"CANCELED", &counters.failure_canceled},
                               {"BACKEND", &counters.failure_backend},
                               {"OTHER", &counters.failure_other}}) {
        common::PromLabels with_reason = l;
        with_reason.emplace_back("reason", reason);
        p.Sample("nv_inference_request_failure", with_reason, double(n->load()));
      }
      p.Family("nv_inference_pending_request_count", "gauge",
               "Inference requests accepted and not yet answered.");
      // The cv model's alone: completions are counted in vLLM's gauge, and
      // an agent sums the two.
      p.Sample("nv_inference_pending_request_count", l,
               double(counters.in_service.load() - counters.llm_running.load()));
    }
    p.Family("gpuha_worker_in_service", "gauge", "Inference requests in service now.");
    p.Sample("gpuha_worker_in_service", {}, double(counters.in_service.load()));
    p.Family("vllm:num_requests_running", "gauge", "Completions being generated now.");
    p.Sample("vllm:num_requests_running", {}, double(counters.llm_running.load()));
    common::AppendProcessFamilies("worker", &p);
    return p.str();
  }

  // Everything but the waiting: which endpoint, and the model's answer.
  Reply Route(const http::request<http::string_body>& req) {
    std::string target(req.target());
    std::string path(common::TargetPath(target));
    bool get = req.method() == http::verb::get || req.method() == http::verb::head;
    if (path == "/v2/health/live" || path == "/v2/health/ready") {
      if (!get) return Error(405, absl::StrCat(path, " takes GET"));
      return {200, "", "text/plain", false, 0};
    }
    if (path == "/metrics") return {200, Metrics(), common::PromText::kContentType, false, 0};
    if (path == "/v1/fault") {
      if (req.method() == http::verb::post) {
        common::QueryParams q = common::QueryParams::FromTarget(target);
        auto f = ParseWorkerFault(std::string(q.Get("mode").value_or("")),
                                  std::string(q.Get("factor").value_or("")));
        if (!f.ok()) return Error(400, std::string(f.status().message()));
        SetFault(*f);
      } else if (!get) {
        return Error(405, "/v1/fault takes GET or POST");
      }
      return {
          200,
          json{{"mode", FaultModeName(fault_mode.load())}, {"factor", slow_factor.load()}}.dump(),
          "application/json", false, 0};
    }
    if (path == "/v1/models") {
      if (!get) return Error(405, "/v1/models takes GET");
      return {200, LlmModelsJson(), "application/json", false, 0};
    }
    if (path == "/v2") {
      return {200,
              json{{"name", "gpuha-worker"},
                   {"version", "0.1.0"},
                   {"extensions", {"binary_tensor_data"}}}
                  .dump(),
              "application/json", false, 0};
    }
    std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
    // v2 models NAME [versions V] [ready|infer]
    if (parts.size() < 3 || parts[0] != "v2" || parts[1] != "models") {
      return Error(404, absl::StrCat("no endpoint ", path));
    }
    const std::string& model = parts[2];
    size_t next = 3;
    if (parts.size() > 4 && parts[3] == "versions") {
      if (parts[4] != kModelVersion) {
        return Error(404, absl::StrCat("request for unknown model: '", model, "' version ",
                                       parts[4], " is not found"));
      }
      next = 5;
    }
    if (model != kModelName) {
      return Error(404, absl::StrCat("request for unknown model: '", model, "' is not found"));
    }
    std::string op = next < parts.size() ? parts[next] : "";
    if (next + 1 < parts.size() || (op != "" && op != "ready" && op != "infer")) {
      return Error(404, absl::StrCat("no endpoint ", path));
    }
    if (op.empty()) {
      if (!get) return Error(405, "model metadata takes GET");
      return {200, ModelMetadataJson(), "application/json", false, 0};
    }
    if (op == "ready") return {200, "", "text/plain", false, 0};
    if (req.method() != http::verb::post) return Error(405, "infer takes POST");
    std::optional<size_t> json_length;
    if (auto h = req.find("Inference-Header-Content-Length"); h != req.end()) {
      uint64_t n = 0;
      if (!absl::SimpleAtoi(absl::string_view(h->value().data(), h->value().size()), &n)) {
        return Error(400, "Inference-Header-Content-Length: not a byte count");
      }
      json_length = n;
    }
    auto parsed = ParseInferRequest(req.body(), json_length);
    if (!parsed.ok()) return Error(400, std::string(parsed.status().message()));
    auto result = RunCv(*parsed);
    if (!result.ok()) return Error(400, std::string(result.status().message()));
    Reply r{200, InferResponseJson(parsed->id, *result), "application/json", true, 0};
    absl::StatusOr<std::optional<int64_t>> delay =
        common::QueryParams::FromTarget(target).Int("delay_ms");
    if (!delay.ok()) return Error(400, std::string(delay.status().message()));
    if (*delay) r.extra_delay_ms = **delay;
    return r;
  }

  // Waits `d` of modelled GPU time, as the fault in force bends it: longer
  // while slow, without end while stuck. False when the fault is `cut`.
  net::awaitable<bool> GpuWait(std::chrono::milliseconds d) {
    net::steady_timer t(co_await net::this_coro::executor);
    error_code ec;
    for (bool waited = false;;) {
      FaultMode m = fault_mode.load();
      if (m == FaultMode::kCut) co_return false;
      if (m == FaultMode::kStuck) {
        t.expires_after(std::chrono::milliseconds(10));
      } else if (waited) {
        co_return true;
      } else {
        waited = true;
        t.expires_after(
            m == FaultMode::kSlow
                ? std::chrono::duration_cast<std::chrono::milliseconds>(d * slow_factor.load())
                : d);
      }
      co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
  }

  // One completion (worker/llm.h), streamed or whole. False: the connection
  // is to close (asked for, a write failed, or the fault cut it).
  net::awaitable<bool> ServeLlm(beast::tcp_stream& s, const http::request<http::string_body>& req,
                                LlmApi api, bool close) {
    error_code ec;
    auto head = [&](int status, const char* type, bool chunked, size_t length) {
      counters.CountHttpAnswer(api == LlmApi::kCompletions ? 0 : 1, status);
      return absl::StrCat(
          "HTTP/1.1 ", status, " ",
          std::string(http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)))),
          "\r\nContent-Type: ", type, "\r\n",
          chunked ? "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                  : absl::StrCat("Content-Length: ", length, "\r\n"),
          o.node.empty() ? "" : absl::StrCat("X-Gpuha-Node: ", o.node, "\r\n"),
          status == 503 ? "Retry-After: 1\r\n" : "", close ? "Connection: close\r\n" : "", "\r\n");
    };
    auto write = [&](const std::string& out) -> net::awaitable<bool> {
      s.expires_after(std::chrono::seconds(60));
      co_await net::async_write(s, net::buffer(out), net::redirect_error(net::use_awaitable, ec));
      co_return !ec;
    };
    auto whole = [&](int status, const std::string& body) -> net::awaitable<bool> {
      bool ok = co_await write(head(status, "application/json", false, body.size()) + body);
      co_return ok && !close;
    };
    if (req.method() != http::verb::post) {
      co_return co_await whole(405, LlmErrorJson(405, "completions take POST"));
    }
    if (o.strict_fields) {
      if (std::optional<std::string> why = UnknownOpenAiField(api, req.body())) {
        co_return co_await whole(400, LlmErrorJson(400, *why));
      }
    }
    absl::StatusOr<LlmRequest> r = ParseLlmRequest(api, req.body());
    if (!r.ok()) {
      std::string msg(r.status().message());
      co_return co_await whole(400, LlmErrorJson(400, msg, msg.substr(0, msg.find(':'))));
    }
    if (r->model != kLlmModelName && r->model != kLlmBpeModelName) {
      co_return co_await whole(
          404,
          LlmErrorJson(404, absl::StrCat("The model `", r->model, "` does not exist."), "model"));
    }
    if (counters.in_service.fetch_add(1) >= o.capacity) {
      counters.in_service.fetch_sub(1);
      counters.at_capacity++;
      co_return co_await whole(
          503, LlmErrorJson(
                   503, absl::StrCat("worker at capacity (", o.capacity, " requests in service)")));
    }
    struct InService {
      WorkerCounters& c;
      ~InService() {
        c.in_service.fetch_sub(1);
        c.llm_running.fetch_sub(1);
      }
    } in_service{counters};
    counters.llm_running.fetch_add(1);
    if (fault_mode.load() == FaultMode::kErrors) {
      co_return co_await whole(500,
                               LlmErrorJson(500,
                                            "CUDA error: an illegal memory access was encountered "
                                            "(worker fault 'errors')"));
    }
    LlmGenerator lm(*r);
    const int prompt_tokens = lm.prompt_tokens();
    // vLLM's return_token_ids, where the model has IDs.
    const bool ids = r->return_token_ids && lm.has_ids();
    const std::string id = absl::StrCat("cmpl-", o.node.empty() ? "w" : o.node, "-", ++seq);
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    std::string chunk;
    auto event = [&](const std::string& data) {
      std::string e = absl::StrCat("data: ", data, "\n\n");
      absl::StrAppend(&chunk, absl::Hex(e.size()), "\r\n", e, "\r\n");
    };
    if (r->stream) {
      if (!co_await write(head(200, "text/event-stream", true, 0))) co_return false;
      if (api == LlmApi::kChat) {
        event(LlmChunkJson(
            api, id, created, r->model, "", std::nullopt, /*role_only=*/true,
            ids ? std::optional<ChunkIds>(ChunkIds{{}, &lm.prompt_ids()}) : std::nullopt));
        if (!co_await write(chunk)) co_return false;
        chunk.clear();
      }
    }
    LlmAnswer a;
    a.prompt_tokens = prompt_tokens;
    a.prompt_token_ids = lm.prompt_ids();
    a.finish_reason = "length";
    for (int i = 0; i < r->max_tokens; ++i) {
      if (!co_await GpuWait(i == 0 ? o.ttft : o.token_latency)) co_return false;  // cut
      // The prompt counts once it is processed (prefill done), as vLLM
      // counts it: a stuck engine that still takes requests shows no progress.
      if (i == 0) counters.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
      LlmGenerator::Step t = lm.Next();
      bool last = t.end || i + 1 == r->max_tokens;
      if (t.end) a.finish_reason = "stop";
      if (!t.end) {
        a.text.append(t.text);
        if (lm.has_ids()) a.token_ids.push_back(t.id);
        ++a.completion_tokens;
        counters.generation_tokens++;
      }
      if (!r->stream) {
        if (t.end) break;
        continue;
      }
      if (!t.end || last) {
        std::optional<ChunkIds> chunk_ids;
        if (ids) {
          chunk_ids = ChunkIds{t.end ? std::nullopt : std::optional<int>(t.id),
                               api == LlmApi::kCompletions && i == 0 ? &lm.prompt_ids() : nullptr};
        }
        event(LlmChunkJson(api, id, created, r->model, t.text,
                           last ? std::optional<std::string_view>(a.finish_reason) : std::nullopt,
                           false, chunk_ids));
      }
      if (last) {
        if (r->include_usage) {
          event(
              LlmUsageChunkJson(api, id, created, r->model, a.prompt_tokens, a.completion_tokens));
        }
        event("[DONE]");
        chunk += "0\r\n\r\n";
      }
      if (!co_await write(chunk)) co_return false;
      chunk.clear();
      if (last) break;
    }
    counters.llm_success++;
    if (r->stream) co_return !close;
    co_return co_await whole(200, LlmResponseJson(api, id, created, r->model, a, ids));
  }

  net::awaitable<void> Serve(tcp::socket sock) {
    beast::tcp_stream s(std::move(sock));
    beast::flat_buffer buf;
    for (;;) {
      error_code ec;
      http::request_parser<http::string_body> p;
      p.header_limit(16 * 1024);
      p.body_limit(o.max_body_bytes);
      s.expires_after(std::chrono::seconds(60));  // idle and slow clients
      co_await http::async_read(s, buf, p, net::redirect_error(net::use_awaitable, ec));
      Reply reply;
      bool close = false;
      auto started = SteadyClock::now();
      if (ec == http::error::end_of_stream || ec == net::error::eof ||
          ec == beast::error::timeout || ec == net::error::connection_reset ||
          ec == net::error::operation_aborted) {
        co_return;
      } else if (ec == http::error::body_limit) {
        reply = Error(413, absl::StrCat("body: more than ", o.max_body_bytes, " bytes"));
        close = true;
      } else if (ec == http::error::header_limit) {
        reply = Error(431, "headers: more than 16384 bytes");
        close = true;
      } else if (ec) {
        reply = Error(400, "malformed request: " + ec.message());
        close = true;
      } else {
        auto& req = p.get();
        close = !req.keep_alive();
        std::string_view target(req.target().data(), req.target().size());
        std::string path(common::TargetPath(std::string(target)));
        if (path == "/v1/completions" || path == "/v1/chat/completions") {
          LlmApi api = path == "/v1/completions" ? LlmApi::kCompletions : LlmApi::kChat;
          if (!co_await ServeLlm(s, req, api, close)) {
            s.socket().shutdown(tcp::socket::shutdown_send, ec);
            co_return;
          }
          continue;
        }
        bool infer = target.find("/infer") != std::string_view::npos;
        if (infer && counters.in_service.fetch_add(1) >= o.capacity) {
          counters.in_service.fetch_sub(1);
          counters.at_capacity++;
          counters.failure_rejected++;
          reply =
              Error(503, absl::StrCat("worker at capacity (", o.capacity, " requests in service)"));
          infer = false;
        } else {
          reply = Route(req);
        }
        if (reply.gpu && fault_mode.load() == FaultMode::kErrors) {
          reply = Error(500,
                        "inference failed: CUDA error: an illegal memory access was encountered "
                        "(worker fault 'errors')");
        }
        if (reply.gpu) {
          net::steady_timer t(s.get_executor());
          // Stuck: the request waits, accepted and pending, until the fault
          // is cleared; nothing executes meanwhile.
          while (fault_mode.load() == FaultMode::kStuck) {
            t.expires_after(std::chrono::milliseconds(10));
            co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
          }
          if (fault_mode.load() == FaultMode::kCut) {
            counters.in_service.fetch_sub(1);
            counters.failure_backend++;
            s.socket().close(ec);  // no answer at all: a crash, as the network sees it
            co_return;
          }
          counters.executions++;
          auto gpu_time = o.latency + std::chrono::milliseconds(reply.extra_delay_ms);
          if (fault_mode.load() == FaultMode::kSlow) {
            gpu_time = std::chrono::duration_cast<std::chrono::milliseconds>(gpu_time *
                                                                             slow_factor.load());
          }
          t.expires_after(gpu_time);
          co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
        }
        if (infer) {
          counters.in_service.fetch_sub(1);
          if (reply.status == 200) {
            counters.success++;
            counters.inferences++;
            counters.duration_us += static_cast<uint64_t>(
                std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - started)
                    .count());
          } else if (reply.status >= 500) {
            counters.failure_backend++;
          } else if (reply.status != 404) {  // a model not served: nobody's failure
            counters.failure_other++;
          }
        }
        if (target.find("/infer") != std::string_view::npos) {
          counters.CountHttpAnswer(2, reply.status);
        }
        if (req.method() == http::verb::head) reply.body.clear();
      }
      std::string out = absl::StrCat(
          "HTTP/1.1 ", reply.status, " ",
          std::string(
              http::obsolete_reason(http::int_to_status(static_cast<unsigned>(reply.status)))),
          "\r\nContent-Type: ", reply.content_type, "\r\nContent-Length: ", reply.body.size(),
          "\r\n", o.node.empty() ? "" : absl::StrCat("X-Gpuha-Node: ", o.node, "\r\n"),
          reply.status == 503 ? "Retry-After: 1\r\n" : "", close ? "Connection: close\r\n" : "",
          "\r\n", reply.body);
      s.expires_after(std::chrono::seconds(60));
      co_await net::async_write(s, net::buffer(out), net::redirect_error(net::use_awaitable, ec));
      if (ec || close) {
        s.socket().shutdown(tcp::socket::shutdown_send, ec);
        co_return;
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(WorkerOptions o) {
  if (o.threads < 1) return absl::InvalidArgumentError("--threads: must be at least 1");
  if (o.capacity < 1) return absl::InvalidArgumentError("--capacity: must be at least 1");
  if (o.latency.count() < 0) return absl::InvalidArgumentError("--latency: must not be negative");
  if (o.ttft.count() < 0) return absl::InvalidArgumentError("--ttft: must not be negative");
  if (o.token_latency.count() < 0) {
    return absl::InvalidArgumentError("--token-latency: must not be negative");
  }
  std::unique_ptr<Worker> w(new Worker());
  w->impl_ = std::make_unique<Impl>();
  w->impl_->o = o;
  w->impl_->SetFault(o.fault);
  Impl* impl = w->impl_.get();
  auto server = common::LoopServer::Start(
      o.address, o.port, o.threads, [impl](tcp::socket s) { return impl->Serve(std::move(s)); });
  if (!server.ok()) return server.status();
  w->server_ = std::move(*server);
  if (o.grpc_port >= 0) {
    auto g = GrpcWorker::Start({impl->o, impl->counters, impl->fault_mode, impl->slow_factor},
                               static_cast<uint16_t>(o.grpc_port));
    if (!g.ok()) return g.status();
    w->grpc_ = std::move(*g);
  }
  return w;
}

const WorkerCounters& Worker::counters() const { return impl_->counters; }

uint16_t Worker::grpc_port() const { return grpc_ ? grpc_->port() : 0; }

void Worker::Stop() {
  if (server_) server_->Stop();
  if (grpc_) grpc_->Stop();
}

Worker::~Worker() {
  server_.reset();  // its loops run Impl's coroutines
  grpc_.reset();
  impl_.reset();
}

}  // namespace gpuha::worker
