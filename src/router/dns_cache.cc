#include "router/dns_cache.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>

#include "common/log.h"
#include "common/net_util.h"

namespace gpuha::router {

namespace net = boost::asio;

bool DnsCache::IsIpAddress(const std::string& address) {
  auto hp = common::ParseHostPort(address, "upstream");
  if (!hp.ok()) return false;
  boost::system::error_code ec;
  net::ip::make_address(hp->host, ec);
  return !ec;
}

std::optional<DnsCache::Endpoint> DnsCache::SystemResolve(const std::string& address,
                                                          std::string* error) {
  auto hp = common::ParseHostPort(address, "upstream");
  if (!hp.ok()) {
    *error = std::string(hp.status().message());
    return std::nullopt;
  }
  net::io_context ioc;
  net::ip::tcp::resolver resolver(ioc);
  boost::system::error_code ec;
  auto results = resolver.resolve(hp->host, std::to_string(hp->port), ec);
  if (ec || results.empty()) {
    *error = ec ? ec.message() : "no address";
    return std::nullopt;
  }
  std::optional<Endpoint> best;
  for (const auto& r : results) {
    if (!best || (r.endpoint().address().is_v4() && !best->address().is_v4())) best = r.endpoint();
  }
  return best;
}

void DnsCache::Store(const std::string& address, std::optional<Endpoint> ep,
                     const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = answers_.find(address);
  bool known = it != answers_.end();
  if (known && it->second == ep) return;
  if (!ep) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "router: upstream name {} does not resolve ({}); it answers 502 "
        "upstream_unresolved until it does",
        address, error);
  } else if (known) {
    spdlog::info("router: upstream name {} now resolves to {}", address, ep->address().to_string());
  }
  answers_[address] = ep;
  generation_.fetch_add(1, std::memory_order_release);
}

void DnsCache::Track(const std::vector<std::string>& addresses) {
  for (const std::string& a : addresses) {
    if (IsIpAddress(a)) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (answers_.count(a) != 0) continue;
    }
    std::string error;
    std::optional<Endpoint> ep = resolve_(a, &error);
    Store(a, ep, error);
  }
}

std::optional<DnsCache::Endpoint> DnsCache::Find(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = answers_.find(address);
  return it == answers_.end() ? std::nullopt : it->second;
}

size_t DnsCache::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answers_.size();
}

void DnsCache::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { RefreshLoop(); });
}

void DnsCache::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DnsCache::RefreshLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, refresh_, [this] { return stopping_; });
    if (stopping_) return;
    std::vector<std::string> names;
    for (const auto& [a, _] : answers_) names.push_back(a);
    lock.unlock();
    // Resolved outside the lock: Find never waits for getaddrinfo.
    for (const std::string& a : names) {
      std::string error;
      std::optional<Endpoint> ep = resolve_(a, &error);
      Store(a, ep, error);
    }
    lock.lock();
  }
}

}  // namespace gpuha::router
