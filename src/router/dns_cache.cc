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

void DnsCache::StoreLocked(const std::string& address, std::optional<Endpoint> ep,
                           const std::string& error) {
  auto it = answers_.find(address);
  if (it == answers_.end()) return;  // dropped from the routes meanwhile
  Entry& e = it->second;
  e.next = std::chrono::steady_clock::now() + (ep ? refresh_ : std::min(refresh_, kRetry));
  if (e.tried && e.ep == ep) return;
  if (!ep) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "router: upstream name {} does not resolve ({}); it answers 502 "
        "upstream_unresolved until it does",
        address, error);
  } else if (e.tried) {
    spdlog::info("router: upstream name {} now resolves to {}", address, ep->address().to_string());
  }
  e.tried = true;
  e.ep = ep;
  generation_.fetch_add(1, std::memory_order_release);
}

void DnsCache::Track(const std::vector<std::string>& addresses, common::Duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  std::map<std::string, Entry> kept;
  bool added = false;
  for (const std::string& a : addresses) {
    if (IsIpAddress(a) || kept.count(a) != 0) continue;
    auto it = answers_.find(a);
    if (it != answers_.end()) {
      kept.emplace(a, it->second);
    } else {
      kept.emplace(a, Entry{});  // due at once
      added = true;
    }
  }
  if (kept.size() != answers_.size() || added) generation_.fetch_add(1, std::memory_order_release);
  answers_ = std::move(kept);
  if (!added) return;
  cv_.notify_all();
  answered_.wait_for(lock, wait, [this] {
    if (stopping_ || !thread_.joinable()) return true;
    for (const auto& [_, e] : answers_) {
      if (!e.tried) return false;
    }
    return true;
  });
}

std::optional<DnsCache::Endpoint> DnsCache::Find(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = answers_.find(address);
  return it == answers_.end() ? std::nullopt : it->second.ep;
}

size_t DnsCache::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answers_.size();
}

void DnsCache::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Run(); });
}

void DnsCache::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  answered_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DnsCache::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::string> due;
    auto wake = now + refresh_;
    for (const auto& [a, e] : answers_) {
      if (e.next <= now) {
        due.push_back(a);
      } else {
        wake = std::min(wake, e.next);
      }
    }
    if (due.empty()) {
      cv_.wait_until(lock, wake);
      continue;
    }
    lock.unlock();
    // Resolved outside the lock: Find and Track never wait for getaddrinfo.
    std::vector<std::pair<std::optional<Endpoint>, std::string>> results;
    for (const std::string& a : due) {
      std::string error;
      std::optional<Endpoint> ep = resolve_(a, &error);
      results.emplace_back(std::move(ep), std::move(error));
    }
    lock.lock();
    for (size_t i = 0; i < due.size(); ++i) {
      StoreLocked(due[i], results[i].first, results[i].second);
    }
    answered_.notify_all();
  }
}

}  // namespace gpuha::router
