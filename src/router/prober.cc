#include "router/prober.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/net_util.h"
#include "router/tls_contexts.h"

namespace gpuha::router {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using std::chrono::milliseconds;

// Unanswered probes in a row before an upstream is judged hung.
constexpr int kHangReadings = 2;

Prober::Prober(const RouterConfig& config, const DnsCache* dns, OnVerdict on_verdict)
    : config_(config), dns_(dns), on_verdict_(std::move(on_verdict)) {}

Prober::~Prober() { Stop(); }

void Prober::Start() {
  if (config_.probe_interval.count() <= 0) return;
  net::co_spawn(ioc_, ProbeLoop(), net::detached);
  thread_ = std::thread([this] { ioc_.run(); });
}

void Prober::Stop() {
  ioc_.stop();
  if (thread_.joinable()) thread_.join();
}

void Prober::SetRoutes(std::shared_ptr<const RouteTable> routes) {
  std::lock_guard<std::mutex> lock(mu_);
  routes_ = std::move(routes);
}

void Prober::SetTls(std::shared_ptr<ssl::context> tls) {
  std::lock_guard<std::mutex> lock(mu_);
  tls_ = std::move(tls);
}

awaitable<void> Prober::Probe(std::string address) {
  auto hp = common::ParseHostPort(address, "upstream");
  error_code ec;
  if (!hp.ok()) co_return;
  auto a = net::ip::make_address(hp->host, ec);
  // A DNS name is probed at its latest answer, looked up again for each new
  // connection.
  const bool named = static_cast<bool>(ec);
  tcp::endpoint ep = named ? tcp::endpoint() : tcp::endpoint(a, hp->port);
  auto ex = co_await net::this_coro::executor;
  std::unique_ptr<beast::tcp_stream> s;
  std::shared_ptr<ssl::context> tls_ctx;
  std::unique_ptr<ssl::stream<beast::tcp_stream&>> tls;  // over *s with upstream_tls
  auto close = [&] {
    tls.reset();
    s.reset();
  };
  beast::flat_buffer buf;
  std::string request =
      absl::StrCat(config_.probe_method, " ", config_.probe_path, " HTTP/1.1\r\nHost: ", address,
                   "\r\nUser-Agent: gpuha-router-probe\r\n");
  if (!config_.probe_content_type.empty()) {
    absl::StrAppend(&request, "Content-Type: ", config_.probe_content_type, "\r\n");
  }
  if (config_.probe_method == "POST" || !config_.probe_body.empty()) {
    absl::StrAppend(&request, "Content-Length: ", config_.probe_body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", config_.probe_body);
  Timer tick(ex);
  auto set = [&](Health h) {
    Health& cur = state_[address];
    if (cur == h) return;
    cur = h;
    if (h == Health::kHung) hangs_++;
    if (h == Health::kDown) downs_++;
    spdlog::warn("router: upstream {} is {}", address,
                 h == Health::kUp     ? "up"
                 : h == Health::kDown ? "down (refused)"
                                      : "hung (no answer)");
    on_verdict_(address, h);
  };
  // Probes in a row that got no answer in hang_after. One is not a
  // verdict (as Envoy's unhealthy_threshold): a loaded host delays a probe
  // past 100 ms now and then, and a hung server fails the next one too,
  // sent at once.
  int silent_in_a_row = 0;
  auto silent = [&] {
    if (++silent_in_a_row >= kHangReadings) set(Health::kHung);
  };
  for (;;) {
    std::optional<tcp::endpoint> answer;
    if (named) answer = dns_ != nullptr ? dns_->Find(address) : std::nullopt;
    // A kept-alive probe connection to an address the name has left would
    // judge the wrong server.
    if (answer && *answer != ep) close();
    // No longer in the routes, or a name with no answer (the data path says
    // upstream_unresolved; ProbeLoop starts it again next scan).
    if (!wanted_.count(address) || (named && !answer)) {
      // Its verdict goes with it: an upstream that returns starts clean (its
      // next probe starts from "up" and is only broadcast when it differs).
      if (state_[address] != Health::kUp) on_verdict_(address, Health::kUp);
      state_.erase(address);
      probed_.store(state_.size());
      co_return;
    }
    if (answer) ep = *answer;
    auto started = Clock::now();
    if (!s) {
      s = std::make_unique<beast::tcp_stream>(ex);
      s->expires_after(config_.hang_after);
      co_await s->async_connect(ep, Redirect(ec));
      {
        std::lock_guard<std::mutex> lock(mu_);
        tls_ctx = tls_;
      }
      if (!ec && tls_ctx) {
        tls = std::make_unique<ssl::stream<beast::tcp_stream&>>(*s, *tls_ctx);
        PrepareUpstreamTls(*tls, UpstreamTlsName(config_, hp->host));
        co_await tls->async_handshake(ssl::stream_base::client, Redirect(ec));
        if (ec && ec != beast::error::timeout) {
          spdlog::warn("router: probe of {}: TLS handshake: {}", address, ec.message());
        }
      }
      if (ec) {
        close();
        // Out of descriptors here says nothing about the upstream: no verdict.
        if (ec == beast::error::timeout) {
          silent();
        } else {
          silent_in_a_row = 0;
          if (!common::OutOfDescriptors(ec)) set(Health::kDown);
        }
      }
    }
    if (s) {
      s->expires_after(config_.hang_after -
                       std::chrono::duration_cast<milliseconds>(Clock::now() - started));
      // (Plain if/else: GCC 12 mishandles co_await on a conditional expression.)
      if (tls) {
        co_await net::async_write(*tls, net::buffer(request), Redirect(ec));
      } else {
        co_await net::async_write(*s, net::buffer(request), Redirect(ec));
      }
      http::response_parser<http::string_body> rp;
      rp.body_limit(64 * 1024);
      if (!ec) {
        if (tls) {
          co_await http::async_read(*tls, buf, rp, Redirect(ec));
        } else {
          co_await http::async_read(*s, buf, rp, Redirect(ec));
        }
      }
      probes_++;
      if (ec) {
        // A probe connection the upstream closed is not a verdict; a silent
        // one is.
        const bool timed_out = ec == beast::error::timeout;
        close();
        buf.clear();
        if (timed_out) {
          silent();
        } else {
          silent_in_a_row = 0;
        }
      } else {
        silent_in_a_row = 0;
        // An answer is alive; an error answer (or, with expect_status, any
        // other status) is down: an inference probe that fails is a failed
        // server.
        const int status = rp.get().result_int();
        const bool good =
            config_.probe_expect_status != 0 ? status == config_.probe_expect_status : status < 500;
        if (!good && state_[address] == Health::kUp) {
          spdlog::warn("router: probe of {} answered {}", address, status);
        }
        set(good ? Health::kUp : Health::kDown);
        if (!rp.keep_alive()) close();
      }
    }
    // After a first silence the next probe goes at once: the second
    // reading comes hang_after later, not a probe interval more.
    tick.expires_at(silent_in_a_row > 0 && silent_in_a_row < kHangReadings
                        ? Clock::now()
                        : started + config_.probe_interval);
    co_await tick.async_wait(Redirect(ec));
  }
}

awaitable<void> Prober::ProbeLoop() {
  auto ex = co_await net::this_coro::executor;
  Timer t(ex);
  for (;;) {
    // One scan of the routes per tick; each probe checks the set, not the table.
    wanted_.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (routes_) {
        for (const auto& u : routes_->upstreams()) wanted_.insert(u.address);
      }
    }
    for (const std::string& a : wanted_) {
      // state_ holds exactly the addresses with a running probe.
      if (state_.emplace(a, Health::kUp).second) net::co_spawn(ex, Probe(a), net::detached);
    }
    probed_.store(state_.size());
    t.expires_after(milliseconds(100));
    error_code ec;
    co_await t.async_wait(Redirect(ec));
  }
}
}  // namespace gpuha::router
