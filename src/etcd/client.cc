#include "etcd/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_client.h"
#include "common/net_util.h"

namespace gpuha::etcd {

namespace {

using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;

}  // namespace

std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

bool Unreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

absl::StatusOr<std::shared_ptr<EtcdClient>> EtcdClient::Connect(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("store.etcd: list at least one endpoint");
  }
  std::shared_ptr<EtcdClient> c(new EtcdClient());
  c->timeout_ = options.timeout;
  bool any_tls = false;
  for (const std::string& url : options.endpoints) any_tls |= absl::StartsWith(url, "https://");
  common::ClientTls tls{options.tls_ca, options.tls_cert, options.tls_key, "store.tls"};
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (any_tls && tls.ca.empty() && tls.cert.empty()) {
    creds = grpc::SslCredentials({});  // https with the system's roots
  } else {
    auto made = common::ClientCredentials(tls);
    if (!made.ok()) return made.status();
    creds = *made;
  }
  c->creds_ = creds;
  for (size_t i = 0; i < options.endpoints.size(); ++i) {
    const std::string& url = options.endpoints[i];
    const std::string field = absl::StrCat("store.etcd[", i, "]");
    const bool https = absl::StartsWith(url, "https://");
    if (!https && !absl::StartsWith(url, "http://")) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", url, "' is not http://HOST:PORT or https://HOST:PORT"));
    }
    if (https != any_tls) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", url, "' mixes http and https endpoints; use one scheme"));
    }
    std::string hostport = url.substr(https ? 8 : 7);
    if (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
    auto hp = common::ParseHostPort(hostport, field);
    if (!hp.ok()) return hp.status();
    c->targets_.push_back(hp->str());
    c->endpoints_.push_back(c->Dial(c->targets_.back()));
    c->redialed_.push_back(std::chrono::steady_clock::now());
    c->urls_.push_back(url);
  }
  if (options.require_answer) {
    auto status = c->Status();
    if (!status.ok()) return status.status();
  }
  return c;
}

std::shared_ptr<EtcdClient::Endpoint> EtcdClient::Dial(const std::string& target) const {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);  // a Load of a large table
  // Its own subchannels: a redial must not get the one it replaces back.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto e = std::make_shared<Endpoint>();
  e->channel = grpc::CreateCustomChannel(target, creds_, args);
  e->kv = etcdserverpb::KV::NewStub(e->channel);
  e->lease = etcdserverpb::Lease::NewStub(e->channel);
  e->watch = etcdserverpb::Watch::NewStub(e->channel);
  e->maintenance = etcdserverpb::Maintenance::NewStub(e->channel);
  return e;
}

std::shared_ptr<EtcdClient::Endpoint> EtcdClient::At(size_t i) const {
  std::lock_guard<std::mutex> lock(endpoints_mu_);
  return endpoints_[i];
}

void EtcdClient::Redial(size_t i) {
  // A channel whose connects kept failing (etcd down, then back) took 10 s
  // and more to connect once etcd answered: a fresh one connects at once.
  std::lock_guard<std::mutex> lock(endpoints_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - redialed_[i] < std::chrono::seconds(1)) return;
  redialed_[i] = now;
  endpoints_[i] = Dial(targets_[i]);
}

template <typename Response, typename Call>
absl::StatusOr<Response> EtcdClient::Unary(const char* what, Call call, common::Duration deadline,
                                           bool shared_deadline) {
  const size_t n = endpoints_.size();
  const size_t first = current_.load();
  const auto all_by = std::chrono::system_clock::now() + deadline;
  std::vector<std::string> tried;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    if (shared_deadline && k > 0 && std::chrono::system_clock::now() >= all_by) break;
    grpc::ClientContext ctx;
    ctx.set_deadline(shared_deadline ? all_by : std::chrono::system_clock::now() + deadline);
    // etcd fails the call at once when its cluster has no leader (no quorum)
    // rather than letting it wait out the deadline.
    ctx.AddMetadata("hasleader", "true");
    Response response;
    grpc::Status s = call(*At(i), &ctx, &response);
    if (s.ok()) {
      current_.store(i);
      return response;
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) Redial(i);
    tried.push_back(absl::StrCat(urls_[i], ": ", s.error_message()));
    if (!Unreachable(s)) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("etcd ", what, " at ", tried.back()));
    }
  }
  return absl::UnavailableError(
      absl::StrCat("etcd ", what, ": no endpoint answered (", absl::StrJoin(tried, "; "), ")"));
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(const RangeRequest& r) {
  return Unary<etcdserverpb::RangeResponse>(
      "Range",
      [&](Endpoint& e, grpc::ClientContext* ctx, etcdserverpb::RangeResponse* out) {
        return e.kv->Range(ctx, r, out);
      },
      timeout_);
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const TxnRequest& r) {
  return Unary<etcdserverpb::TxnResponse>(
      "Txn",
      [&](Endpoint& e, grpc::ClientContext* ctx, etcdserverpb::TxnResponse* out) {
        return e.kv->Txn(ctx, r, out);
      },
      timeout_);
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  etcdserverpb::LeaseGrantRequest r;
  r.set_ttl(ttl_seconds);
  auto out = Unary<etcdserverpb::LeaseGrantResponse>(
      "LeaseGrant",
      [&](Endpoint& e, grpc::ClientContext* ctx, etcdserverpb::LeaseGrantResponse* resp) {
        return e.lease->LeaseGrant(ctx, r, resp);
      },
      timeout_);
  if (out.ok() && !out->error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", out->error()));
  }
  return out;
}

absl::Status EtcdClient::LeaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest r;
  r.set_id(id);
  return Unary<etcdserverpb::LeaseRevokeResponse>(
             "LeaseRevoke",
             [&](Endpoint& e, grpc::ClientContext* ctx, etcdserverpb::LeaseRevokeResponse* resp) {
               return e.lease->LeaseRevoke(ctx, r, resp);
             },
             timeout_)
      .status();
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAliveOnce(int64_t id, common::Duration deadline) {
  auto out = Unary<etcdserverpb::LeaseKeepAliveResponse>(
      "LeaseKeepAlive",
      [&](Endpoint& e, grpc::ClientContext* ctx, etcdserverpb::LeaseKeepAliveResponse* resp) {
        // The keep-alive is a stream; one request and its answer is a renewal.
        auto stream = e.lease->LeaseKeepAlive(ctx);
        etcdserverpb::LeaseKeepAliveRequest req;
        req.set_id(id);
        if (!stream->Write(req) || !stream->Read(resp)) {
          stream->WritesDone();
          grpc::Status s = stream->Finish();  // the stream's own error, not CANCELLED
          return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed")
                        : s;
        }
        stream->WritesDone();
        ctx->TryCancel();
        stream->Finish();
        return grpc::Status::OK;
      },
      deadline, /*shared_deadline=*/true);
  if (!out.ok()) return out.status();
  return out->ttl();  // 0 or less: the lease is gone (expired or revoked)
}

void WatchCancel::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
}

absl::StatusOr<std::vector<etcdserverpb::Event>> EtcdClient::WatchOnce(
    const std::string& key, const std::string& range_end, int64_t start_revision,
    common::Duration wait, bool no_puts, WatchCancel* cancel) {
  const size_t i = current_.load();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + wait);
  ctx.AddMetadata("hasleader", "true");  // no quorum: an error, not a silent watch
  if (cancel != nullptr) {
    std::lock_guard<std::mutex> lock(cancel->mu_);
    if (cancel->cancelled_) return std::vector<etcdserverpb::Event>{};
    cancel->ctx_ = &ctx;
  }
  absl::Cleanup forget = [cancel] {
    if (cancel == nullptr) return;
    std::lock_guard<std::mutex> lock(cancel->mu_);
    cancel->ctx_ = nullptr;
  };
  std::shared_ptr<Endpoint> endpoint = At(i);  // kept while the stream lives
  auto stream = endpoint->watch->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
  create->set_key(key);
  create->set_range_end(range_end);
  create->set_start_revision(start_revision);
  if (no_puts) create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  std::vector<etcdserverpb::Event> events;
  std::string canceled;
  bool created = false;  // etcd confirmed the watch: silence then means no change
  if (stream->Write(req)) {
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      created |= resp.created() || resp.events_size() > 0;
      if (resp.canceled()) {
        canceled = resp.compact_revision() > 0 ? absl::StrCat("revision ", start_revision,
                                                              " is compacted (etcd keeps from ",
                                                              resp.compact_revision(), ")")
                                               : resp.cancel_reason();
        break;
      }
      if (resp.events_size() > 0) {
        events.assign(resp.events().begin(), resp.events().end());
        break;
      }
    }
  }
  stream->WritesDone();
  ctx.TryCancel();
  grpc::Status s = stream->Finish();
  if (!canceled.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd Watch at ", urls_[i], ": canceled: ", canceled));
  }
  if (!events.empty() || s.error_code() == grpc::StatusCode::CANCELLED) return events;
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // A watch etcd never confirmed proves nothing (a link that drops packets).
    if (created) return events;
    return absl::UnavailableError(
        absl::StrCat("etcd Watch at ", urls_[i], ": no answer within ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(wait).count(), " ms"));
  }
  return absl::UnavailableError(absl::StrCat("etcd Watch at ", urls_[i], ": ", s.error_message()));
}

absl::StatusOr<etcdserverpb::StatusResponse> EtcdClient::Status() {
  return Unary<etcdserverpb::StatusResponse>(
      "Status",
      [&](Endpoint& e, grpc::ClientContext* ctx, etcdserverpb::StatusResponse* out) {
        return e.maintenance->Status(ctx, etcdserverpb::StatusRequest(), out);
      },
      timeout_);
}

}  // namespace gpuha::etcd
