#include "controller/operator_api.h"

#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net_util.h"
#include "common/query.h"
#include "controller/controller.h"
#include "controller/dashboard.h"
#include "controller/job.h"

namespace gpuha::controller {
namespace {

using nlohmann::json;

// One call, matched to its route: `parts` are the path's segments after
// /api/v1/ (parts[1] is a node, stream or job where the route has ":").
struct ApiCall {
  Controller& c;
  const common::HttpRequest& r;
  const std::vector<std::string>& parts;
  const json& status_extra;
};
using Handler = common::HttpResponse (*)(const ApiCall&);
struct Route {
  const char* method;
  const char* path;  // segments; ":" matches any one
  ApiRole min;       // the least role that may call it
  Handler handle;
};

// A view that may name what is not there: 200 or 404.
common::HttpResponse Found(const absl::StatusOr<json>& j) {
  return j.ok() ? JsonResponse(200, *j) : JsonError(404, std::string(j.status().message()));
}
// A change: `ok` with its answer, or the refusal's own code.
common::HttpResponse Done(const absl::StatusOr<json>& j, int ok = 200) {
  return j.ok() ? JsonResponse(ok, *j)
                : JsonError(HttpCode(j.status()), std::string(j.status().message()));
}
common::HttpResponse Removed(const absl::Status& s, const std::string& what) {
  return Done(s.ok() ? absl::StatusOr<json>(json{{"removed", what}}) : s);
}
// A node operation's answer: the node as it is now.
common::HttpResponse NodeAfter(const ApiCall& a, const absl::Status& s) {
  if (!s.ok()) return JsonError(HttpCode(s), std::string(s.message()));
  auto n = a.c.NodeJson(a.parts[1]);
  return JsonResponse(200, n.ok() ? *n : json::object());
}

common::HttpResponse SetRole(const ApiCall& a) {
  json body = json::parse(a.r.body, nullptr, false);
  if (!body.is_object() || !body.contains("role") || !body["role"].is_string()) {
    return JsonError(400, "role: the body must be {\"role\": \"active|passive|buffer\"}");
  }
  const std::string want = body["role"];
  std::optional<Role> role = ParseRole(want);
  if (!role) {
    return JsonError(400, absl::StrCat("role: '", want, "' is not one of active, passive, buffer"));
  }
  return NodeAfter(a, a.c.SetRole(a.parts[1], *role));
}

common::HttpResponse AddStream(const ApiCall& a) {
  json body = json::parse(a.r.body, nullptr, false);
  if (!body.is_object()) return JsonError(400, "body: not a JSON object");
  for (auto& [key, value] : body.items()) {
    if (key != "id" && key != "tenant" && key != "weight") {
      return JsonError(400, absl::StrCat(key, ": unknown field (expected id, tenant, weight)"));
    }
  }
  if (!body.contains("id") || !body["id"].is_string() || body["id"].get<std::string>().empty()) {
    return JsonError(400, "id: a non-empty string is required");
  }
  if (!body.contains("tenant") || !body["tenant"].is_string()) {
    return JsonError(400, "tenant: a string is required");
  }
  int64_t weight = 1;
  if (body.contains("weight")) {
    if (!body["weight"].is_number_integer() || body["weight"].get<int64_t>() < 1) {
      return JsonError(400, "weight: must be an integer of at least 1");
    }
    weight = body["weight"];
  }
  auto added = a.c.AddStream({body["id"], body["tenant"], weight});
  if (!added.ok()) return Done(added.status());
  return JsonResponse(
      201, {{"id", added->stream}, {"primary", added->primary}, {"standby", added->standby}});
}

common::HttpResponse AddJob(const ApiCall& a) {
  json body = json::parse(a.r.body, nullptr, false);
  if (body.is_discarded()) return JsonError(400, "body: not JSON");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(body);
  if (!spec.ok()) return JsonError(400, std::string(spec.status().message()));
  return Done(a.c.AddJob(*spec), 201);
}

common::HttpResponse Events(const ApiCall& a) {
  absl::StatusOr<std::optional<int64_t>> after =
      common::QueryParams::FromTarget(a.r.target).Int("after");
  if (!after.ok()) return JsonError(400, std::string(after.status().message()));
  return JsonResponse(200, a.c.EventsJson(*after, 1000));
}

common::HttpResponse Status(const ApiCall& a) {
  json status = a.c.StatusJson();
  status.update(a.status_extra);
  return JsonResponse(200, status);
}

constexpr ApiRole kViewer = ApiRole::kViewer, kOperator = ApiRole::kOperator,
                  kAdmin = ApiRole::kAdmin;

// Every route of /api/v1, first match wins. A job is a command the agents
// run on GPU nodes as their own user: adding one is as much as holding the
// nodes, so it needs admin, as a role change does.
const Route kRoutes[] = {
    {"GET", "nodes", kViewer, [](const ApiCall& a) { return JsonResponse(200, a.c.NodesJson()); }},
    {"GET", "nodes/:", kViewer, [](const ApiCall& a) { return Found(a.c.NodeJson(a.parts[1])); }},
    {"DELETE", "nodes/:", kAdmin,
     [](const ApiCall& a) { return Removed(a.c.RemoveNode(a.parts[1]), a.parts[1]); }},
    {"POST", "nodes/:/drain", kOperator,
     [](const ApiCall& a) {
       return NodeAfter(a,
                        a.c.Drain(a.parts[1], a.r.target.find("force=true") != std::string::npos));
     }},
    {"POST", "nodes/:/undrain", kOperator,
     [](const ApiCall& a) { return NodeAfter(a, a.c.Undrain(a.parts[1])); }},
    {"POST", "nodes/:/fail", kOperator,
     [](const ApiCall& a) { return NodeAfter(a, a.c.Fail(a.parts[1])); }},
    {"POST", "nodes/:/rebind", kAdmin,
     [](const ApiCall& a) { return NodeAfter(a, a.c.RebindNode(a.parts[1])); }},
    {"POST", "nodes/:/role", kAdmin, SetRole},
    {"POST", "nodes/:/:", kOperator,
     [](const ApiCall& a) {
       return JsonError(404, absl::StrCat("no operation '", a.parts[2], "' on nodes"));
     }},
    {"GET", "streams", kViewer,
     [](const ApiCall& a) { return JsonResponse(200, a.c.StreamsJson()); }},
    {"POST", "streams", kOperator, AddStream},
    {"GET", "streams/:", kViewer,
     [](const ApiCall& a) { return Found(a.c.StreamJson(a.parts[1])); }},
    {"DELETE", "streams/:", kOperator,
     [](const ApiCall& a) { return Removed(a.c.RemoveStream(a.parts[1]), a.parts[1]); }},
    {"GET", "jobs", kViewer, [](const ApiCall& a) { return JsonResponse(200, a.c.JobsJson()); }},
    {"POST", "jobs", kAdmin, AddJob},
    {"GET", "jobs/:", kViewer, [](const ApiCall& a) { return Found(a.c.JobJson(a.parts[1])); }},
    {"DELETE", "jobs/:", kOperator,
     [](const ApiCall& a) { return Removed(a.c.RemoveJob(a.parts[1]), a.parts[1]); }},
    {"POST", "jobs/:/confirm-fenced", kOperator,
     [](const ApiCall& a) { return Done(a.c.ConfirmJobFence(a.parts[1])); }},
    {"GET", "tenants", kViewer,
     [](const ApiCall& a) { return JsonResponse(200, a.c.TenantsJson()); }},
    {"GET", "failovers", kViewer,
     [](const ApiCall& a) { return JsonResponse(200, a.c.FailoversJson()); }},
    {"GET", "history", kViewer,
     [](const ApiCall& a) { return JsonResponse(200, a.c.HistoryJson()); }},
    {"GET", "routers", kViewer,
     [](const ApiCall& a) { return JsonResponse(200, a.c.RoutersJson()); }},
    {"GET", "capacity", kViewer,
     [](const ApiCall& a) { return JsonResponse(200, a.c.CapacityJson()); }},
    {"GET", "status", kViewer, Status},
    {"GET", "events", kViewer, Events},
};

bool Matches(const Route& route, const common::HttpRequest& r,
             const std::vector<std::string>& parts) {
  if (r.method != route.method) return false;
  std::vector<absl::string_view> want = absl::StrSplit(route.path, '/');
  if (want.size() != parts.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != ":" && want[i] != parts[i]) return false;
  }
  return true;
}

// The bearer token's role, or the 401 that refuses it. With no tokens
// configured (a loopback-only development setup) every caller is admin.
absl::StatusOr<ApiRole> RoleOf(const ControllerConfig& config, const common::HttpRequest& r) {
  if (config.tokens.empty()) return ApiRole::kAdmin;
  auto auth = r.headers.find("authorization");
  if (auth == r.headers.end() || auth->second.rfind("Bearer ", 0) != 0) {
    return absl::UnauthenticatedError("missing bearer token");
  }
  auto token = config.tokens.find(Sha256Hex(auth->second.substr(7)));
  if (token == config.tokens.end()) return absl::UnauthenticatedError("unknown bearer token");
  return token->second.role;
}

}  // namespace

common::HttpResponse JsonResponse(int status, const json& body) {
  common::HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = body.dump(2) + "\n";
  return r;
}

common::HttpResponse JsonError(int status, const std::string& message) {
  return JsonResponse(status, {{"error", message}});
}

int HttpCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

common::HttpResponse OperatorApi(Controller* c, const ControllerConfig& config,
                                 const common::HttpRequest& r, const json& status_extra) {
  if (r.path == "/" || r.path == "/dashboard") {
    if (r.method != "GET") return JsonError(405, "the dashboard takes GET");
    return common::HttpResponse{200, "text/html; charset=utf-8", DashboardHtml(), {}};
  }
  if (r.path.rfind("/api/v1/", 0) != 0) return JsonError(404, "not found");
  absl::StatusOr<ApiRole> role = RoleOf(config, r);
  if (!role.ok()) {
    common::HttpResponse e = JsonError(401, std::string(role.status().message()));
    e.headers.push_back({"WWW-Authenticate", "Bearer"});
    return e;
  }
  std::vector<std::string> parts = absl::StrSplit(r.path.substr(8), '/', absl::SkipEmpty());
  for (const Route& route : kRoutes) {
    if (!Matches(route, r, parts)) continue;
    if (static_cast<int>(*role) < static_cast<int>(route.min)) {
      return JsonError(403, absl::StrCat("this needs the ", ApiRoleName(route.min),
                                         " role; the token has ", ApiRoleName(*role)));
    }
    return route.handle({*c, r, parts, status_extra});
  }
  return JsonError(404, absl::StrCat("no ", r.method, " ", r.path));
}

}  // namespace gpuha::controller
