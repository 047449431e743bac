// The operator API (/api/v1) and the dashboard, as a table of handlers:
// each route names its method, its path (":" matches one segment) and the
// least role its bearer token needs (viewers read, operators act, admins
// change roles, remove nodes and add jobs). The leader's ControllerServer
// and a standby's StandbyServer both answer through it (a standby with the
// state it last read, writes redirected before they come here).
//
//   common::HttpResponse r = OperatorApi(&controller, config, request);
//
// Errors are JSON {"error": "..."}: 401 without a known bearer token, 403
// naming the role needed and the token's, 404 for no such route, and the
// controller's own refusals with their HTTP codes (HttpCode).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "common/http_server.h"
#include "controller/controller_config.h"

namespace gpuha::controller {

class Controller;

common::HttpResponse JsonResponse(int status, const nlohmann::json& body);
common::HttpResponse JsonError(int status, const std::string& message);
// The HTTP status of a controller refusal: 400, 404, 409, 503, else 500.
int HttpCode(const absl::Status& s);

// The dashboard and /api/v1 of `c`. `status_extra` is merged into
// /api/v1/status (a standby names the leader there).
common::HttpResponse OperatorApi(Controller* c, const ControllerConfig& config,
                                 const common::HttpRequest& r,
                                 const nlohmann::json& status_extra = nlohmann::json::object());

}  // namespace gpuha::controller
