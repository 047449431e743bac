// The command line of one etcd-server member on loopback, for the processes
// gpuha starts itself: the demo's three-member cluster (LocalCluster) and
// the one-member etcd of the store tests.
//
//   SpawnProcess(EtcdArgv({.name = "etcd-1", .data_dir = dir, .client_port = 2379,
//                          .peer_port = 2380, .initial_cluster = "etcd-1=http://127.0.0.1:2380"}));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gpuha::common {

struct EtcdMember {
  std::string name;
  std::string data_dir;  // a restart finds it and rejoins; the initial flags count once
  uint16_t client_port = 0;
  uint16_t peer_port = 0;
  std::string initial_cluster;  // "NAME=http://127.0.0.1:PEER,..."
  // Clients may also reach it on this address (a test's veth), same port.
  std::string also_client_host{};
  // Clients over TLS (https), and only with a certificate this CA signed
  // (--client-cert-auth), when all three are set. Peers stay on http.
  std::string tls_cert{}, tls_key{}, tls_ca{};
};

inline std::vector<std::string> EtcdArgv(const EtcdMember& m) {
  const bool tls = !m.tls_cert.empty() && !m.tls_key.empty() && !m.tls_ca.empty();
  const std::string scheme = tls ? "https://" : "http://";
  const std::string client = absl::StrCat(scheme, "127.0.0.1:", m.client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> argv = {
      "/usr/bin/etcd",
      "--name",
      m.name,
      "--data-dir",
      m.data_dir,
      "--listen-client-urls",
      m.also_client_host.empty()
          ? client
          : absl::StrCat(client, ",", scheme, m.also_client_host, ":", m.client_port),
      "--advertise-client-urls",
      client,
      "--listen-peer-urls",
      peer,
      "--initial-advertise-peer-urls",
      peer,
      "--initial-cluster",
      m.initial_cluster,
      "--initial-cluster-token",
      "gpuha-local",
      "--initial-cluster-state",
      "new",
      "--logger",
      "zap",
      "--log-outputs",
      "stderr"};
  if (tls) {
    for (const std::string& a :
         {std::string("--cert-file"), m.tls_cert, std::string("--key-file"), m.tls_key,
          std::string("--trusted-ca-file"), m.tls_ca, std::string("--client-cert-auth")}) {
      argv.push_back(a);
    }
  }
  return argv;
}

}  // namespace gpuha::common
