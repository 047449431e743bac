#include "router/router_config.h"

#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "common/net_util.h"

namespace gpuha::router {
namespace {

std::string Hash(const std::string& k) { return common::Sha256Hex(k); }

TEST(RouterConfigTest, ParsesAFullFile) {
  std::string yaml = R"(listen: 127.0.0.1:8443
admin: 127.0.0.1:9901
threads: 2
id: edge-1
controllers: [127.0.0.1:7400, "localhost:7410"]
tls: {cert: s.pem, key: s.key}
upstream_tls: {ca: ca.pem, cert: r.pem, key: r.key, server_name: infer.internal}
tenants:
  - name: acme
    api_keys_sha256: [)" +
                     Hash("k1") + R"(]
    requests_per_second: 100
    burst: 20
    max_concurrent: 8
routes:
  - {stream: cam-1, tenant: acme, primary: 127.0.0.1:9001, standby: 127.0.0.1:9002,
     primary_grpc: 127.0.0.1:9101, standby_grpc: 127.0.0.1:9102}
limits: {max_header_bytes: 8192, retry_buffer_bytes: 4096, response_timeout_ms: 2000,
         h2_max_concurrent_streams: 64}
failover: {retry_budget_percent: 10, retry_min_per_second: 5, retry_burst: 50,
           probe_interval_ms: 20, hang_after_ms: 80}
)";
  auto c = ParseRouterConfig(yaml, "r.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen.port, 8443);
  EXPECT_EQ(c->admin.port, 9901);
  EXPECT_EQ(c->threads, 2);
  EXPECT_EQ(c->router_id, "edge-1");
  ASSERT_EQ(c->controllers.size(), 2u);
  EXPECT_EQ(c->controllers[1].str(), "127.0.0.1:7410");
  ASSERT_EQ(c->tenants.size(), 1u);
  EXPECT_EQ(c->tenants[0].key_hashes[0], Hash("k1"));
  EXPECT_EQ(c->tenants[0].max_concurrent, 8);
  EXPECT_DOUBLE_EQ(c->tenants[0].burst, 20);
  ASSERT_EQ(c->routes.size(), 1u);
  EXPECT_EQ(c->routes[0].standby, "127.0.0.1:9002");
  EXPECT_EQ(c->routes[0].primary_grpc, "127.0.0.1:9101");
  EXPECT_EQ(c->routes[0].standby_grpc, "127.0.0.1:9102");
  EXPECT_EQ(c->limits.h2_max_concurrent_streams, 64u);
  EXPECT_EQ(c->limits.max_header_bytes, 8192u);
  EXPECT_EQ(c->limits.retry_buffer_bytes, 4096u);
  EXPECT_EQ(c->limits.response_timeout.count(), 2000);
  EXPECT_EQ(c->hang_after.count(), 80);
  EXPECT_DOUBLE_EQ(c->retry_min_per_second, 5);
  EXPECT_DOUBLE_EQ(c->retry_burst, 50);
  EXPECT_EQ(c->upstream_ca, "ca.pem");
  EXPECT_EQ(c->upstream_cert, "r.pem");
  EXPECT_EQ(c->upstream_key, "r.key");
  EXPECT_EQ(c->upstream_server_name, "infer.internal");
}

// Regression: the router rejected upper-case key hashes that the
// controller's token reader accepted. One rule now, stored lower case.
TEST(RouterConfigTest, UpperCaseKeyHashIsReadAsLowerCase) {
  std::string upper = absl::AsciiStrToUpper(Hash("k1"));
  auto c =
      ParseRouterConfig("tenants:\n  - name: a\n    api_keys_sha256: [" + upper + "]\n", "r.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenants[0].key_hashes[0], Hash("k1"));
}

TEST(RouterConfigTest, TheExampleFileLoads) {
  auto c = LoadRouterConfig(GPUHA_SOURCE_DIR "/examples/router.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenants.size(), 2u);
  EXPECT_EQ(c->controllers.size(), 1u);
}

TEST(RouterConfigTest, LlmRoutesDefaultToOpenAisAndCanBeSwitchedOff) {
  auto d = ParseRouterConfig("auth: none\n", "open.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->llm.continuation);
  ASSERT_EQ(d->llm.routes.size(), 2u);
  EXPECT_EQ(d->llm.routes[1].path, "/v1/chat/completions");
  auto c = ParseRouterConfig(
      "auth: none\nllm:\n  max_text_bytes: 4096\n  routes:\n"
      "    - {path: /v1/chat/completions, api: chat, continuation: false}\n"
      "    - {path: /generate, api: completions}\n",
      "llm.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->llm.max_text_bytes, 4096u);
  ASSERT_EQ(c->llm.routes.size(), 2u);
  EXPECT_FALSE(c->llm.routes[0].continuation);
  EXPECT_EQ(c->llm.routes[1].api, LlmApi::kCompletions);
  EXPECT_TRUE(c->llm.routes[1].continuation);
}

TEST(RouterConfigTest, DefaultsAreUsable) {
  auto c = ParseRouterConfig("auth: none\n", "open.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->auth_none);
  EXPECT_EQ(c->listen.str(), "127.0.0.1:8080");
  EXPECT_EQ(c->admin.str(), "127.0.0.1:8081");  // fixed, for Prometheus
  EXPECT_EQ(c->dns_refresh, std::chrono::seconds(30));
  EXPECT_TRUE(c->tenants.empty());
  EXPECT_GT(c->probe_interval.count(), 0);
}

struct BadCase {
  std::string yaml;
  std::string expect;  // substring of the error
};

TEST(RouterConfigTest, BadInputNamesTheField) {
  std::vector<BadCase> cases = {
      {"listen: nowhere", "listen"},
      {"threads: -1", "threads"},
      {"auth: none\ndns: { refresh_ms: 0 }", "dns.refresh_ms"},
      {"tenants:\n  - name: a\n    api_keys_sha256: [abc]", "tenants[0].api_keys_sha256"},
      {"tenants:\n  - name: a\n    api_keys_sha256: [" + std::string(64, 'g') + "]",
       "is not a hex SHA-256"},
      {"tenants:\n  - api_keys_sha256: [" + Hash("x") + "]", "name"},
      {"tenants:\n  - {name: a, api_keys_sha256: [" + Hash("x") +
           "]}\n  - {name: b, "
           "api_keys_sha256: [" +
           Hash("x") + "]}",
       "two tenants"},
      {"routes:\n  - {stream: s, primary: 1.2.3.4}", "routes[0].primary"},
      {"routes:\n  - {stream: s, primary: 127.0.0.1:1, primary_grpc: x}", "routes[0].primary_grpc"},
      {"routes:\n  - {stream: s, primary: 127.0.0.1:1, standby_grpc: 127.0.0.1:3}",
       "routes[0].standby_grpc"},
      {"limits: {h2_max_concurrent_streams: 0}", "limits.h2_max_concurrent_streams"},
      {"routes:\n  - {stream: s, primary: 127.0.0.1:1}\n  - {stream: s, primary: 127.0.0.1:2}",
       "listed twice"},
      {"tenants:\n  - {name: a, api_keys_sha256: [" + Hash("x") +
           "]}\nroutes:\n  - {stream: s, tenant: b, primary: 127.0.0.1:1}",
       "tenant 'b'"},
      {"limits: {max_headers: 0}", "limits.max_headers"},
      {"auth: none\nllm: {continuation: maybe}", "llm.continuation"},
      {"auth: none\nllm: {max_continuations: -1}", "llm.max_continuations"},
      {"auth: none\nllm: {routes: [{path: v1/x, api: chat}]}", "llm.routes[0].path"},
      {"auth: none\nllm: {routes: [{path: /v1/x, api: embeddings}]}", "llm.routes[0].api"},
      {"auth: none\nllm: {routes: [{path: /v1/x}]}", "llm.routes[0].api"},
      {"auth: none\nllm: {routes: [{path: /a, api: chat}, {path: /a, api: chat}]}",
       "'/a' is listed twice"},
      {"auth: none\nllm: {routs: []}", "routs"},
      {"limits: {header_timeout_ms: soon}", "limits.header_timeout_ms"},
      {"failover: {probe_interval_ms: 50, hang_after_ms: 20}", "hang_after_ms"},
      {"failover: {probe_path: health}", "probe_path"},
      {"auth: none\nfailover: {probe: {method: PUT}}", "failover.probe.method"},
      {"auth: none\nfailover: {probe: {expect_status: 700}}", "failover.probe.expect_status"},
      {"failover: {retry_burst: 0}", "failover.retry_burst"},
      {"tls: {cert: a.pem}", "tls"},
      {"upstream_tls: {cert: r.pem, key: r.key}", "upstream_tls.ca"},
      {"upstream_tls: {ca: ca.pem, cert: r.pem}", "upstream_tls.key"},
      {"upstream_tls: {ca: ca.pem, sni: x}", "upstream_tls.sni"},
      {"listn: 127.0.0.1:80", "listn"},
      // Regression: an emptied file turned authentication off on reload.
      {"", "tenants: none listed: every request would pass without an API key"},
      {"auth: none\ntenants:\n  - {name: a, api_keys_sha256: [" + Hash("x") + "]}",
       "auth: is none, but tenants are listed"},
      {"auth: nobody", "auth: 'nobody' is not one of: api_key, none"},
      // Found by the hostile-input test: a static route's stream was not
      // checked, and the router started with a stream no request can name.
      {"auth: none\nroutes:\n  - {stream: \"a/b\", primary: \"127.0.0.1:1\"}",
       "routes[0].stream: 'a/b' must be"},
      {"tenants:\n  - {name: a, api_keys_sha256: [" + Hash("x") + "], default_stream: \"a b\"}",
       "tenants[0].default_stream"},
      // Regression: values that passed and broke every request at run time.
      {"limits: {max_header_bytes: 4294967296}", "limits.max_header_bytes: must be between"},
      {"tenants:\n  - {name: a, api_keys_sha256: [" + Hash("x") + "], burst: 1e300}",
       "tenants[0].burst: must be between 1 and"},
      {"tenants:\n  - {name: a, api_keys_sha256: [" + Hash("x") + "], requests_per_second: 1e-12}",
       "tenants[0].requests_per_second: must be 0 (off) or between"},
      {"limits: {header_timeout_ms: 9223372036854775807}",
       "limits.header_timeout_ms: must be between 1 and 3600000 ms"},
  };
  for (const BadCase& b : cases) {
    auto c = ParseRouterConfig(b.yaml, "r.yaml");
    ASSERT_FALSE(c.ok()) << b.yaml;
    EXPECT_NE(c.status().message().find(b.expect), std::string::npos)
        << "yaml: " << b.yaml << "\nerror: " << c.status().message();
    EXPECT_NE(c.status().message().find("r.yaml"), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace gpuha::router
