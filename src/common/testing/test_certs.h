// MakeTestCerts: a throwaway CA, a server certificate for 127.0.0.1 and a
// client certificate, made with the openssl command line for mTLS tests.
// Files: ca.pem, server.pem/.key, agent.pem/.key in `dir`.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace gpuha::testing {

// `clients` names more client certificates (NAME.pem/.key, CN=NAME and a
// DNS SAN of NAME), for tests of the controller's node identity check.
inline bool MakeTestCerts(const std::string& dir, const std::vector<std::string>& clients = {}) {
  std::string names = "server agent";
  for (const std::string& c : clients) names += " " + c;
  std::ofstream(dir + "/make_certs.sh") << R"(set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
  -out ca.pem -days 1 -subj /CN=gpuha-test-ca 2>/dev/null
for who in )" + names + R"(; do
  printf 'subjectAltName=IP:127.0.0.1,DNS:%s\n' "$who" > san.ext
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$who.key" \
    -out "$who.csr" -subj "/CN=$who" 2>/dev/null
  openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$who.pem" \
    -days 1 -extfile san.ext 2>/dev/null
done
)";
  return std::system(("cd '" + dir + "' && bash make_certs.sh").c_str()) == 0;
}

}  // namespace gpuha::testing
