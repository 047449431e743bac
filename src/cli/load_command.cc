#include "cli/load_command.h"

#include <cstdio>
#include <iostream>

#include "absl/strings/str_split.h"
#include "cli/exit_codes.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/net_util.h"

namespace gpuha::cli {

LoadCommand::LoadCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("load", "Load through the router: N streams, T seconds, checked");
  app_->add_option("--target", target_,
                   "Router HOST:PORT, or several, comma-separated: the load goes to the first "
                   "and on to the next when one refuses a connection or closes one with "
                   "nothing back (its request is sent there again)")
      ->capture_default_str();
  app_->add_option("--streams", o_.streams, "Streams PREFIX0..PREFIX{N-1}")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app_->add_option("--stream-prefix", o_.stream_prefix, "Stream id prefix")->capture_default_str();
  app_->add_option("--rate", o_.rate, "Requests/s in all, open loop; 0: closed loop")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app_->add_option("--concurrency", o_.concurrency, "Closed loop: clients")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app_->add_option("--seconds", seconds_, "How long to send")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app_->add_option("--timeout", timeout_s_, "Per-request timeout, seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  app_->add_option("--key", o_.api_key, "Tenant API key (or $GPUHA_API_KEY)")
      ->envname("GPUHA_API_KEY");
  app_->add_option("--path", o_.path, "Path after /streams/ID")->capture_default_str();
  app_->add_flag("--direct", o_.direct,
                 "Send --path as it is, without /streams/ID: straight to one server, for a "
                 "baseline");
  app_->add_option("--method", o_.method, "HTTP method")->capture_default_str();
  app_->add_option("--body", o_.body, "Request body");
  app_->add_option("--slow-fraction", o_.slow_fraction,
                   "Share of requests sent with --slow-query (legitimately slow work)")
      ->check(CLI::Range(0.0, 1.0));
  app_->add_option("--slow-query", o_.slow_query, "Query appended to slow requests");
  app_->add_flag("--infer", o_.infer,
                 "KServe v2 inference on the worker's 'cv' model, every answer checked "
                 "(POST /v2/models/cv/infer unless --path is given)");
  app_->add_option("--image-side", o_.image_side, "--infer: image side in pixels (RGB)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app_->add_option(
          "--protocol", protocol_,
          "http: a request per answer; sse: streamed completions of the worker's "
          "language model, every token timed and every answer checked "
          "(POST /v1/completions unless --path is given); grpc: KServe v2 ModelInfer "
          "calls of the worker's 'cv' model over HTTP/2, every answer checked; grpc-stream: "
          "a ModelStreamInfer call per stream, each request a message on it, every "
          "message answered once, in order, and checked")
      ->capture_default_str()
      ->check(CLI::IsMember({"http", "sse", "grpc", "grpc-stream"}));
  app_->add_option("--max-tokens", o_.max_tokens, "--protocol sse: max_tokens of each completion")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app_->add_option("--llm-model", o_.llm_model,
                   "--protocol sse: the model (gpuha-tiny-bpe: the tokenizer model, every answer "
                   "also checked token ID for token ID)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpuha-tiny", "gpuha-tiny-bpe"}));
  app_->add_flag("--llm-chat", o_.llm_chat,
                 "--protocol sse: every other request a chat, to the chat route beside --path");
  app_->add_flag("--llm-structured", o_.llm_structured,
                 "--protocol sse: every fourth request held to a JSON schema (response_format); "
                 "its answer must be a document of it, or end with the router's error event");
  app_->add_flag("--llm-seeded", o_.llm_seeded,
                 "--protocol sse: every other pair of requests with a seed and temperature 0.7");
  app_->add_flag("--no-resend", no_resend_,
                 "A request that gets nothing back fails, never sent again (a client that "
                 "never retries, to compare proxies' restarts); a gRPC stream message whose "
                 "call the router ended draining, saying it was not taken, still goes on a "
                 "new call");
  app_->add_option("--json", json_path_, "Also write the report as JSON here");
  app_->add_flag("--quiet", quiet_, "No progress line");
}

int LoadCommand::Run() {
  std::vector<common::HostPort> routers;
  for (absl::string_view one : absl::StrSplit(target_, ',')) {
    auto hp = common::ParseHostPort(std::string(one), "--target");
    if (!hp.ok()) {
      spdlog::error("load: {}", hp.status().message());
      return kExitBadInput;
    }
    routers.push_back(*hp);
  }
  if (o_.path.empty() || o_.path[0] != '/') {
    spdlog::error("load: --path: must start with '/'");
    return kExitBadInput;
  }
  if (o_.infer && app_->count("--path") == 0) o_.path = "/v2/models/cv/infer";
  o_.sse = protocol_ == "sse";
  o_.grpc = protocol_ == "grpc";
  o_.grpc_stream = protocol_ == "grpc-stream";
  if (o_.sse && app_->count("--path") == 0) o_.path = "/v1/completions";
  o_.host = routers[0].host;
  o_.port = routers[0].port;
  o_.more_routers.assign(routers.begin() + 1, routers.end());
  o_.duration = std::chrono::milliseconds(static_cast<int64_t>(seconds_ * 1000));
  o_.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
  o_.progress = !quiet_;
  o_.resend = !no_resend_;
  auto report = load::RunLoad(o_);
  if (!report.ok()) {
    spdlog::error("load: {}", report.status().message());
    return kExitBadInput;
  }
  std::cout << report->Text();
  if (!json_path_.empty()) {
    if (absl::Status s = common::WriteFileAtomic(json_path_, report->Json() + "\n"); !s.ok()) {
      spdlog::error("load: {}", s.message());
      return kExitFailure;
    }
  }
  return report->failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace gpuha::cli
