#include "controller/etcd.h"

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

namespace gpuha::controller {

namespace {

using etcdserverpb::Compare;
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

std::string EventKey(const std::string& prefix, int64_t id) {
  return absl::StrFormat("%se/%020d", prefix, id);
}

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

// ---- EtcdStore ----

EtcdStore::EtcdStore(std::shared_ptr<EtcdClient> client, std::string prefix, size_t max_txn_ops)
    : client_(std::move(client)),
      prefix_(std::move(prefix)),
      max_txn_ops_(std::max<size_t>(1, max_txn_ops)) {}

void EtcdStore::SetFence(const std::string& key, int64_t create_revision) {
  std::lock_guard<std::mutex> lock(mu_);
  fence_key_ = key;
  fence_revision_ = create_revision;
}

void EtcdStore::AddFence(TxnRequest* txn) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (fence_key_.empty()) return;
  Compare* c = txn->add_compare();
  c->set_key(fence_key_);
  c->set_target(Compare::CREATE);
  c->set_result(Compare::EQUAL);
  c->set_create_revision(fence_revision_);
}

void EtcdStore::OnFenceLost(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  on_fence_lost_ = std::move(f);
}

absl::Status EtcdStore::FenceLost() const {
  std::function<void()> lost;
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = absl::FailedPreconditionError(absl::StrCat(
        "store: this controller no longer leads (", fence_key_,
        " is not the one created at revision ", fence_revision_, "); its write was refused"));
    lost.swap(on_fence_lost_);
  }
  if (lost) lost();
  return s;
}

absl::Status EtcdStore::Apply(const std::vector<StoreWrite>& batch) {
  // etcd refuses a key twice in one transaction: the last write of a key wins,
  // as it would applied in order.
  std::map<std::string, std::optional<std::string>> last;
  for (const StoreWrite& w : batch) {
    last[absl::StrCat(prefix_, "t/", w.table, "/", w.key)] = w.value;
  }
  // etcd takes at most --max-txn-ops operations in each list of a
  // transaction (128 by default): a larger batch goes as several, in order,
  // each fenced. It is then not atomic; raise etcd's limit and
  // store.max_txn_ops together to keep it so.
  if (last.size() > max_txn_ops_) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      spdlog::warn(
          "store: a batch of {} writes goes as {} etcd transactions and is not atomic; raise "
          "etcd's --max-txn-ops and store.max_txn_ops (now {}) to keep batches whole",
          last.size(), (last.size() + max_txn_ops_ - 1) / max_txn_ops_, max_txn_ops_);
    }
  }
  // The meta rows (epoch, route version) go last: split, each transaction
  // lands whole, and a version never names rows that are not there yet.
  std::vector<std::pair<std::string, std::optional<std::string>>> ops(last.begin(), last.end());
  const std::string meta = absl::StrCat(prefix_, "t/meta/");
  std::stable_partition(ops.begin(), ops.end(),
                        [&](const auto& op) { return op.first.rfind(meta, 0) != 0; });
  auto it = ops.begin();
  while (it != ops.end()) {
    TxnRequest txn;
    AddFence(&txn);
    for (size_t n = 0; n < max_txn_ops_ && it != ops.end(); ++n, ++it) {
      etcdserverpb::RequestOp* op = txn.add_success();
      if (it->second) {
        op->mutable_request_put()->set_key(it->first);
        op->mutable_request_put()->set_value(*it->second);
      } else {
        op->mutable_request_delete_range()->set_key(it->first);
      }
    }
    auto r = client_->Txn(txn);
    if (!r.ok()) return r.status();
    if (!r->succeeded()) return FenceLost();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> EtcdStore::Load(const std::string& table) {
  const std::string from = absl::StrCat(prefix_, "t/", table, "/");
  RangeRequest req;
  req.set_key(from);
  req.set_range_end(PrefixEnd(from));
  req.set_revision(read_revision_.load());
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  std::map<std::string, std::string> rows;
  for (const etcdserverpb::KeyValue& kv : r->kvs()) rows[kv.key().substr(from.size())] = kv.value();
  return rows;
}

absl::StatusOr<std::optional<etcdserverpb::KeyValue>> EtcdStore::Get(const std::string& key) {
  RangeRequest req;
  req.set_key(key);
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  if (r->kvs().empty()) return std::optional<etcdserverpb::KeyValue>();
  return std::optional<etcdserverpb::KeyValue>(r->kvs(0));
}

absl::StatusOr<int64_t> EtcdStore::AppendEvent(const std::string& json) {
  std::lock_guard<std::mutex> lock(append_mu_);
  const std::string next_key = prefix_ + "e-next";
  // Compare-and-swap on the counter; a retry after an answer that was lost
  // finds its own event in place and does not append it twice.
  bool ambiguous = false;  // the last attempt's answer was lost: it may have applied
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto next = Get(next_key);
    if (!next.ok()) return next.status();
    int64_t id = 1;
    if (*next && (!absl::SimpleAtoi((*next)->value(), &id) || id < 1)) {
      // The counter only says where the events end, which their keys say
      // too: a damaged one (written by hand, a bad restore) is rebuilt from
      // them rather than stopping every event from being stored.
      auto newest = NewestEventId();
      if (!newest.ok()) return newest.status();
      spdlog::warn("store: {} holds '{}', not an event id; counting on from the newest event ({})",
                   next_key, absl::CHexEscape((*next)->value().substr(0, 64)), *newest);
      id = *newest + 1;
    }
    if (attempt > 0 && id > 1) {  // a resent Txn may have applied: ours is there
      auto mine = Get(EventKey(prefix_, id - 1));
      if (mine.ok() && *mine && (*mine)->value() == json) return id - 1;
    }
    TxnRequest txn;
    AddFence(&txn);
    Compare* c = txn.add_compare();
    c->set_key(next_key);
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::MOD);
    c->set_mod_revision(*next ? (*next)->mod_revision() : 0);
    etcdserverpb::PutRequest* event = txn.add_success()->mutable_request_put();
    event->set_key(EventKey(prefix_, id));
    event->set_value(json);
    etcdserverpb::PutRequest* counter = txn.add_success()->mutable_request_put();
    counter->set_key(next_key);
    counter->set_value(std::to_string(id + 1));
    auto r = client_->Txn(txn);
    ambiguous = !r.ok() && r.status().code() == absl::StatusCode::kUnavailable;
    if (ambiguous && attempt < 2) continue;  // etcd gone for longer: the caller hears it
    if (!r.ok()) return r.status();
    if (r->succeeded()) return id;
    // The counter moved (another writer, or our own lost answer), or the
    // fence failed: the fence is checked here, the counter next round.
    std::string fence_key;
    int64_t fence_revision = 0;
    {
      std::lock_guard<std::mutex> fence_lock(mu_);
      fence_key = fence_key_;
      fence_revision = fence_revision_;
    }
    if (!fence_key.empty()) {
      auto holder = Get(fence_key);
      if (holder.ok() && (!*holder || (*holder)->create_revision() != fence_revision)) {
        return FenceLost();
      }
    }
  }
  return absl::UnavailableError("store: appending an event kept racing another writer");
}

absl::StatusOr<int64_t> EtcdStore::NewestEventId() {
  RangeRequest req;
  req.set_key(prefix_ + "e/");
  req.set_range_end(PrefixEnd(prefix_ + "e/"));
  req.set_sort_order(RangeRequest::DESCEND);
  req.set_sort_target(RangeRequest::KEY);
  req.set_limit(1);
  req.set_keys_only(true);
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  if (r->kvs().empty()) return 0;
  int64_t id = 0;
  if (!absl::SimpleAtoi(r->kvs(0).key().substr(prefix_.size() + 2), &id)) {
    return absl::DataLossError(absl::StrCat("store: '", r->kvs(0).key(), "' is not an event key"));
  }
  return id;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> EtcdStore::LoadEvents(int64_t after_id,
                                                                                   size_t limit) {
  RangeRequest req;
  req.set_key(EventKey(prefix_, after_id + 1));
  req.set_range_end(PrefixEnd(prefix_ + "e/"));
  req.set_limit(static_cast<int64_t>(limit));
  req.set_revision(read_revision_.load());
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  std::vector<std::pair<int64_t, std::string>> out;
  const size_t skip = prefix_.size() + 2;
  for (const etcdserverpb::KeyValue& kv : r->kvs()) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(kv.key().substr(skip), &id)) {
      return absl::DataLossError(absl::StrCat("store: '", kv.key(), "' is not an event key"));
    }
    out.emplace_back(id, kv.value());
  }
  return out;
}

// ---- EtcdLeader ----

namespace {
// The longest a standby waits on the leader key before it renews its own
// lease and checks for a stop.
constexpr common::Duration kStandbyWait = std::chrono::milliseconds(500);
}  // namespace

EtcdLeader::EtcdLeader(std::shared_ptr<EtcdClient> client, std::string key, std::string identity,
                       common::Duration ttl)
    : client_(std::move(client)), key_(std::move(key)), identity_(std::move(identity)), ttl_(ttl) {}

EtcdLeader::~EtcdLeader() { StopThreads(); }

void EtcdLeader::StopThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watch_cancel_.Cancel();
  if (keepalive_.joinable()) keepalive_.join();
  if (watch_key_.joinable()) watch_key_.join();
}

void EtcdLeader::Lose(const std::string& why) {
  holds_until_ns_ = 0;
  if (lost_.exchange(true)) return;
  on_lost_(why);
}

absl::StatusOr<int64_t> EtcdLeader::Campaign(const std::atomic<bool>* stopping) {
  const int64_t ttl_s = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(ttl_ + std::chrono::milliseconds(999))
             .count());
  std::string last_holder, last_error;
  auto warn = [&](const absl::Status& s) {  // once per distinct error, not every round
    if (s.message() == last_error) return;
    last_error = std::string(s.message());
    spdlog::warn("controller: campaign: {}", last_error);
  };
  while (!stopping->load()) {
    const auto sent = std::chrono::steady_clock::now();
    if (lease_ == 0) {
      auto grant = client_->LeaseGrant(ttl_s);
      if (grant.ok()) {
        lease_ = grant->id();
        renewed_ = sent;
      } else {
        warn(grant.status());
      }
    } else if (auto left = client_->LeaseKeepAliveOnce(lease_, ttl_); left.ok()) {
      if (*left <= 0) {
        lease_ = 0;  // expired while we waited: grant another
        continue;
      }
      renewed_ = sent;
    }
    if (lease_ != 0) {
      // Create the key with our lease unless someone holds it.
      TxnRequest txn;
      Compare* c = txn.add_compare();
      c->set_key(key_);
      c->set_target(Compare::CREATE);
      c->set_result(Compare::EQUAL);
      c->set_create_revision(0);
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(key_);
      put->set_value(identity_);
      put->set_lease(lease_);
      txn.add_failure()->mutable_request_range()->set_key(key_);
      auto r = client_->Txn(txn);
      if (r.ok() && r->succeeded()) return create_revision_ = r->header().revision();
      if (r.ok() && r->responses_size() > 0 && r->responses(0).response_range().kvs_size() > 0) {
        const etcdserverpb::KeyValue& held = r->responses(0).response_range().kvs(0);
        if (held.value() == identity_ && held.lease() == lease_) {
          return create_revision_ = held.create_revision();
        }
        // A leader always holds the key with a lease; one written without
        // (by hand, `etcdctl put`) would never expire and would hold every
        // controller in standby for ever. It is nobody's: deleted, if it is
        // still that same write.
        if (held.lease() == 0) {
          spdlog::warn(
              "controller: the leader key {} holds '{}' with no lease (no controller "
              "writes it so); deleting it and campaigning",
              key_, absl::CHexEscape(held.value()));
          TxnRequest del;
          Compare* same = del.add_compare();
          same->set_key(key_);
          same->set_target(Compare::MOD);
          same->set_result(Compare::EQUAL);
          same->set_mod_revision(held.mod_revision());
          del.add_success()->mutable_request_delete_range()->set_key(key_);
          if (auto d = client_->Txn(del); !d.ok()) {
            warn(d.status());
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
          continue;
        }
        if (held.value() != last_holder) {
          last_holder = held.value();
          if (held.value() == identity_) {  // this process led a moment ago
            spdlog::info(
                "controller: the leader key still holds this controller's previous "
                "lease; waiting for it to go");
          } else {
            spdlog::info("controller: {} leads; standing by to take over", last_holder);
          }
        }
        // Wait for the key's delete (a resign, or the holder's lease ending)
        // rather than polling: the standby campaigns again the moment it
        // goes. Bounded, to renew our own lease and see `stopping`.
        auto gone = client_->WatchOnce(key_, "", r->header().revision() + 1,
                                       std::min<common::Duration>(ttl_ / 4, kStandbyWait),
                                       /*no_puts=*/true);
        if (gone.ok()) continue;
        warn(gone.status());
      } else if (!r.ok()) {
        warn(r.status());
      }
    }
    std::this_thread::sleep_for(
        std::min<common::Duration>(ttl_ / 8, std::chrono::milliseconds(250)));
  }
  return absl::CancelledError("stopped before leading");
}

common::Duration EtcdLeader::Margin() const {
  return std::min<common::Duration>(ttl_ / 10, std::chrono::milliseconds(200));
}

void EtcdLeader::HoldUntil(std::chrono::steady_clock::time_point renewed) {
  holds_until_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        (renewed + ttl_ - Margin()).time_since_epoch())
                        .count();
}

void EtcdLeader::KeepAlive(std::function<void(const std::string& why)> on_lost) {
  HoldUntil(renewed_);  // before the threads run: the leader acts from here
  on_lost_ = std::move(on_lost);
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  watch_key_ = std::thread([this] { WatchKeyLoop(); });
}

void EtcdLeader::WatchKeyLoop() {
  // From the revision that created the key: any later change to it is a
  // delete or another's write (this leader never writes it again).
  int64_t from = create_revision_ + 1;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || lost_) return;
    }
    auto events = client_->WatchOnce(key_, "", from, std::chrono::seconds(5), /*no_puts=*/false,
                                     &watch_cancel_);
    if (!events.ok()) {
      // etcd unreachable (the keep-alive judges that) or the revision
      // compacted: the key is read as it is now, and watched from there.
      etcdserverpb::RangeRequest req;
      req.set_key(key_);
      auto now = client_->Range(req);
      if (now.ok()) {
        if (now->kvs().empty() || now->kvs(0).create_revision() != create_revision_) {
          Lose(absl::StrCat("the leader key ", key_, " is gone or another's"));
          return;
        }
        from = now->header().revision() + 1;
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) return;
      }
      continue;
    }
    for (const etcdserverpb::Event& e : *events) {
      const bool mine = e.type() == etcdserverpb::Event::PUT && e.kv().lease() == lease_ &&
                        e.kv().value() == identity_;
      if (!mine) {
        Lose(absl::StrCat("the leader key ", key_,
                          e.type() == etcdserverpb::Event::DELETE
                              ? " was deleted"
                              : absl::StrCat(" was written by another (", e.kv().value(), ")")));
        return;
      }
      from = e.kv().mod_revision() + 1;
    }
  }
}

void EtcdLeader::KeepAliveLoop() {
  // Renew every third of the TTL, and every 100 ms while renewals fail. The
  // lease counts as lost `margin` before a TTL has passed since the last
  // confirmed renewal was sent: etcd counts its TTL from when it received
  // that renewal, later still, so this process always stops acting before
  // etcd can expire the lease and let another controller lead (as
  // Kubernetes' renewDeadline comes before its leaseDuration).
  const common::Duration margin = Margin();
  auto renewed = renewed_;
  std::string last_error = "no answer";
  bool failing = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      common::Duration pause =
          failing ? std::min<common::Duration>(ttl_ / 10, std::chrono::milliseconds(100))
                  : ttl_ / 3;
      // Wake no later than the moment the lease counts as lost.
      pause = std::max<common::Duration>(
          common::Duration::zero(),
          std::min<common::Duration>(pause,
                                     renewed + ttl_ - margin - std::chrono::steady_clock::now()));
      if (cv_.wait_for(lock, pause, [this] { return stop_; })) return;
    }
    if (lost_) return;  // the key watch found it another's
    const auto sent = std::chrono::steady_clock::now();
    const common::Duration left_of_lease = renewed + ttl_ - margin - sent;
    if (left_of_lease <= common::Duration::zero()) {
      Lose(absl::StrCat(
          "no renewal of the leader lease for ",
          std::chrono::duration_cast<std::chrono::milliseconds>(ttl_ - margin).count(),
          " ms of its ", std::chrono::duration_cast<std::chrono::milliseconds>(ttl_).count(),
          " ms (", last_error, ")"));
      return;
    }
    auto ttl = client_->LeaseKeepAliveOnce(lease_, left_of_lease);
    failing = !ttl.ok();
    if (ttl.ok() && *ttl > 0) {
      renewed = sent;
      if (!lost_) HoldUntil(renewed);
    } else if (ttl.ok()) {
      Lose("the leader lease expired or was revoked");
      return;
    } else {
      last_error = std::string(ttl.status().message());
    }
  }
}

bool EtcdLeader::Holds() const {
  return std::chrono::steady_clock::now().time_since_epoch() <
         std::chrono::nanoseconds(holds_until_ns_.load());
}

void EtcdLeader::Resign() {
  StopThreads();
  holds_until_ns_ = 0;
  if (lease_ != 0) {
    if (absl::Status s = client_->LeaseRevoke(lease_); !s.ok()) {
      spdlog::warn("controller: resigning: {}", std::string(s.message()));
    }
    lease_ = 0;
  }
}

absl::StatusOr<std::string> EtcdLeader::Holder() {
  RangeRequest req;
  req.set_key(key_);
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  return r->kvs().empty() ? std::string() : r->kvs(0).value();
}

}  // namespace gpuha::controller
