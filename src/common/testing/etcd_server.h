// EtcdServer: a real one-member etcd (Debian's etcd-server) on loopback
// ports, with its data in the test's temp directory, killed when the object
// goes. Tests of the etcd store and leadership start one.
//
//   gpuha::testing::EtcdServer etcd;
//   ASSERT_TRUE(etcd.Start()) << etcd.log();
//   ... EtcdClient::Connect({.endpoints = {etcd.url()}}) ...
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/etcd_argv.h"
#include "common/file_util.h"
#include "common/http_server.h"
#include "common/net_util.h"
#include "common/subprocess.h"
#include "common/testing/temp_dir.h"

namespace gpuha::testing {

class EtcdServer {
 public:
  EtcdServer() = default;
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;
  ~EtcdServer() { Kill(); }

  // Starts etcd and waits (up to 15 s) until its client port accepts a
  // connection. False, with the reason in log(), if it does not.
  // `also_host`: clients may reach it there too (a test's veth address).
  // `tls_dir`: clients over https with a client certificate, from the files
  // MakeTestCerts wrote there (server.pem/.key, ca.pem).
  // `port`: its client port (0: a free one).
  bool Start(const std::string& also_host = "", const std::string& tls_dir = "",
             uint16_t port = 0) {
    client_port_ = port != 0 ? port : common::FreeLoopbackPort();
    const uint16_t peer = common::FreeLoopbackPort();
    const std::string dir = (TestTempDir() / absl::StrCat("etcd-", client_port_)).string();
    log_path_ = dir + ".log";
    auto pid = common::SpawnProcess(
        common::EtcdArgv({.name = "t",
                          .data_dir = dir,
                          .client_port = client_port_,
                          .peer_port = peer,
                          .initial_cluster = absl::StrCat("t=http://127.0.0.1:", peer),
                          .also_client_host = also_host,
                          .tls_cert = tls_dir.empty() ? "" : tls_dir + "/server.pem",
                          .tls_key = tls_dir.empty() ? "" : tls_dir + "/server.key",
                          .tls_ca = tls_dir.empty() ? "" : tls_dir + "/ca.pem"}),
        log_path_);
    if (!pid.ok()) {
      start_error_ = std::string(pid.status().message());
      return false;
    }
    pid_ = *pid;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    tls_ = !tls_dir.empty();
    while (std::chrono::steady_clock::now() < deadline) {
      // etcd's /health over its client port: true once it has a leader.
      // Over TLS, its log says when it serves clients.
      if (tls_) {
        if (common::ReadFile(log_path_).value_or("").find("serving client traffic securely") !=
            std::string::npos) {
          return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      auto health = ReadHealth();
      if (health.find("\"health\":\"true\"") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    start_error_ = "etcd did not report healthy within 15 s";
    return false;
  }
  std::string url(const std::string& host = "127.0.0.1") const {
    return absl::StrCat(tls_ ? "https://" : "http://", host, ":", client_port_);
  }
  pid_t pid() const { return pid_; }
  // Stops answering without closing anything (a hung or partitioned etcd),
  // and answers again.
  void Pause() { ::kill(pid_, SIGSTOP); }
  void Resume() { ::kill(pid_, SIGCONT); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::kill(pid_, SIGCONT);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string log() const {
    return absl::StrCat(start_error_, "\n", common::ReadFile(log_path_).value_or("(no log)"));
  }

 private:
  std::string ReadHealth() const {
    auto r = common::HttpCall("GET", "127.0.0.1", client_port_, "/health", "",
                              std::chrono::milliseconds(500));
    return r.ok() ? r->body : "";
  }

  uint16_t client_port_ = 0;
  bool tls_ = false;
  pid_t pid_ = -1;
  std::string log_path_, start_error_;
};

}  // namespace gpuha::testing
