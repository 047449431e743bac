// The controller's dashboard: one static page, served at `/`, that reads the
// same `/api/v1` as `gpuha ctl` (nodes, streams, capacity, failovers, events,
// the traffic history and the routers) once a second, and draws its graphs
// itself as SVG (no external script, no CDN). The page holds no data of its own and needs no auth
// to load; its API calls carry the bearer token given as `#token=...` in the URL (kept in the tab's
// sessionStorage), like any other API client.
#pragma once

namespace gpuha::controller {

const char* DashboardHtml();

}  // namespace gpuha::controller
