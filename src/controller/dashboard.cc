#include "controller/dashboard.h"

namespace gpuha::controller {

const char* DashboardHtml() {
  // Data goes into the page through textContent only, never as HTML.
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpuha cluster</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #1b1f24; }
  h1 { font-size: 1.3em; margin: 0 0 .2em; }
  h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: .25em .6em; border-bottom: 1px solid #e3e6ea; }
  th { background: #f4f6f8; font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .ok { color: #1a7f37; } .warn { color: #9a6700; } .bad { color: #cf222e; font-weight: 600; }
  #status { color: #57606a; }
  #summary span { margin-right: 1.5em; }
  #graphs { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 1em; }
  figure.graph { margin: 0; border: 1px solid #e3e6ea; border-radius: 6px; padding: .4em .6em; }
  figure.graph figcaption { font-size: .9em; color: #57606a; }
  figure.graph svg { width: 100%; height: 80px; display: block; }
  figure.graph polyline { fill: none; stroke: #0969da; stroke-width: 1.5; }
  figure.graph.errors polyline, figure.graph.failovers polyline { stroke: #cf222e; }
  figure.graph svg { border-left: 1px solid #afb8c1; border-bottom: 1px solid #afb8c1; }
  figure.graph .axis { display: flex; justify-content: space-between; font-size: .8em; color: #57606a; }
</style>
</head>
<body>
<h1>gpuha cluster</h1>
<div id="status">loading...</div>
<div id="summary"></div>
<h2>Traffic, last minutes</h2>
<div id="graphs">
<figure class="graph" id="g-requests"><figcaption>requests/s</figcaption><svg viewBox="0 0 300 80" preserveAspectRatio="none"><polyline points=""/></svg><div class="axis"><span></span><span></span><span>now</span></div></figure>
<figure class="graph errors" id="g-errors"><figcaption>errors/s (5xx)</figcaption><svg viewBox="0 0 300 80" preserveAspectRatio="none"><polyline points=""/></svg><div class="axis"><span></span><span></span><span>now</span></div></figure>
<figure class="graph" id="g-p99"><figcaption>p99 latency ms</figcaption><svg viewBox="0 0 300 80" preserveAspectRatio="none"><polyline points=""/></svg><div class="axis"><span></span><span></span><span>now</span></div></figure>
<figure class="graph failovers" id="g-failovers"><figcaption>failovers/min</figcaption><svg viewBox="0 0 300 80" preserveAspectRatio="none"><polyline points=""/></svg><div class="axis"><span></span><span></span><span>now</span></div></figure>
</div>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>role</th><th>state</th><th>health</th>
<th>load / capacity</th><th>GPUs</th><th>reasons</th></tr></thead><tbody></tbody></table>
<h2>GPUs</h2>
<table id="gpus"><thead><tr><th>node</th><th>GPU</th><th>temp C</th><th>power W</th>
<th>util %</th><th>memory GiB</th><th>recent XIDs</th></tr></thead><tbody></tbody></table>
<h2>Routers</h2>
<table id="routers"><thead><tr><th>router</th><th>routes</th><th>answered</th><th>5xx</th>
<th>re-sent</th><th>stalls</th><th>in flight</th><th>p99 ms</th><th>reported</th></tr></thead>
<tbody></tbody></table>
<h2>Failovers</h2>
<table id="failovers"><thead><tr><th>time</th><th>node</th><th>reason</th><th>fault &rarr; detected ms (seen by)</th>
<th>detected &rarr; fenced ms</th><th>&rarr; routes pushed ms</th><th>&rarr; routers acked ms</th>
</tr></thead><tbody></tbody></table>
<h2>Streams</h2>
<table id="streams"><thead><tr><th>stream</th><th>tenant</th><th>primary</th><th>standby</th>
</tr></thead><tbody></tbody></table>
<h2>Jobs</h2>
<table id="jobs"><thead><tr><th>job</th><th>phase</th><th>node</th><th>step</th>
<th>checkpoint</th><th>takeovers</th><th>why</th></tr></thead><tbody></tbody></table>
<h2>Recent events</h2>
<table id="events"><thead><tr><th>time</th><th>event</th><th>node</th><th>detail</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
const m = location.hash.match(/token=([^&]+)/);
if (m) sessionStorage.setItem("gpuha-token", decodeURIComponent(m[1]));
const token = sessionStorage.getItem("gpuha-token");

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const r = await fetch("/api/v1/" + path, { headers });
  if (!r.ok) {
    const hint = r.status === 401 ? " (open this page as /#token=YOUR_TOKEN)" : "";
    throw new Error(path + ": HTTP " + r.status + hint);
  }
  return r.json();
}

function cell(text, cls, num) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "-" : String(text);
  if (cls) td.className = cls;
  if (num) td.classList.add("num");
  return td;
}

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows.map(cells => {
    const tr = document.createElement("tr");
    tr.append(...cells);
    return tr;
  }));
}

const ms = v => (typeof v === "number" ? v.toFixed(1) : "-");
const when = t => (typeof t === "number" ? new Date(t).toISOString().replace("T", " ").slice(0, 23) : "-");
const gib = b => (b / 1073741824).toFixed(1);

// One graph: the points of the last five minutes (or of the last minute
// while there is less history), scaled to the largest; the caption says the
// latest and the largest value, the axis the time span and the scale.
function graph(id, points, field) {
  const fig = document.getElementById(id);
  const label = fig.querySelector("figcaption").textContent.split(":")[0];
  // The controller's clock, not the browser's: the newest point is "now".
  const now = points.length ? points[points.length - 1].unix_ms : Date.now();
  const first = points.length ? points[0].unix_ms : now;
  const span = Math.min(5 * 60 * 1000, Math.max(60 * 1000, now - first));
  const pts = points.filter(p => p.unix_ms >= now - span && typeof p[field] === "number");
  const max = Math.max(0, ...pts.map(p => p[field]));
  const top = max > 0 ? max * 1.1 : 1;
  const line = pts.map(p =>
    (300 * (1 - (now - p.unix_ms) / span)).toFixed(1) + "," + (80 - 78 * p[field] / top).toFixed(1));
  const poly = fig.querySelector("polyline");
  poly.setAttribute("points", line.join(" "));
  fig.dataset.points = String(pts.length);
  fig.dataset.max = String(max);
  const [from, scale] = fig.querySelectorAll(".axis span");
  from.textContent = "-" + (span >= 120000 ? (span / 60000).toFixed(0) + " min"
                                            : (span / 1000).toFixed(0) + " s");
  scale.textContent = "0 to " + (max > 0 ? top.toPrecision(3) : "1");
  const last = pts.length ? pts[pts.length - 1][field] : null;
  fig.querySelector("figcaption").textContent = label + ": now " +
    (last === null ? "-" : last.toFixed(1)) + ", max " + max.toFixed(1);
}
const stateClass = s =>
  s === "alive" ? "ok" : ["suspect", "pending", "rejoining"].includes(s) ? "warn" : "bad";
const healthClass = h => (h === "healthy" ? "ok" : h === "degraded" ? "warn" : "bad");

async function refresh() {
  try {
    const [nodes, streams, capacity, failovers, events, history, routers, jobs] =
      await Promise.all([api("nodes"), api("streams"), api("capacity"), api("failovers"),
                         api("events"), api("history"), api("routers"), api("jobs")]);
    graph("g-requests", history.points, "requests_per_s");
    graph("g-errors", history.points, "errors_per_s");
    graph("g-p99", history.points, "p99_ms");
    // From the stored events: the failovers before a controller restart too.
    graph("g-failovers", history.failovers, "failovers_per_min");
    fill("gpus", nodes.flatMap(n => n.gpus.map(g => [
      cell(n.name), cell(g.index, null, true),
      cell(g.lost ? "lost" : g.temperature_c.toFixed(0), g.lost ? "bad" : null, true),
      cell(g.lost ? "-" : g.power_w.toFixed(0) + " / " + g.power_limit_w.toFixed(0), null, true),
      cell(g.lost ? "-" : g.utilization_pct, null, true),
      cell(g.lost ? "-" : gib(g.memory_used_bytes) + " / " + gib(g.memory_total_bytes), null, true),
      cell(g.xids.map(x => x.xid + " at " + when(x.unix_ms)).join(", "),
           g.xids.length ? "bad" : null)])));
    fill("routers", routers.map(r => [cell(r.router),
      cell("v" + r.route_version + (r.current ? "" : " (behind)"), r.current ? null : "warn"),
      cell(r.answered, null, true), cell(r.errors, r.errors ? "warn" : null, true),
      cell(r.resends, null, true), cell(r.stalls, null, true), cell(r.in_flight, null, true),
      cell(ms(r.p99_ms_since_start), null, true), cell(when(r.reported_unix_ms))]));
    fill("nodes", nodes.map(n => [
      cell(n.name), cell(n.role), cell(n.state + (n.fenced ? ", fenced" : ""), stateClass(n.state)),
      cell(n.health, healthClass(n.health)), cell(n.load + " / " + n.capacity, null, true),
      cell(n.gpus.map(g => {
        // A server per GPU, or per slice of it (MIG): each unit's own
        // placement state and load.
        const unit = u => (u.slice === null ? "" : " mig" + u.slice +
                           (u.profile ? " (" + u.profile + ")" : "")) +
                          (u.in_service ? " " + u.load + "/" + u.capacity : " OUT");
        return "gpu" + g.index + (g.lost ? " lost" : " " + g.temperature_c.toFixed(0) + " C") +
               n.gpu_units.filter(u => u.index === g.index).map(unit).join(",");
      }).join(", "), n.gpu_units.some(u => !u.in_service) ? "warn" : null),
      cell(n.reasons.map(r => r.code + ": " + r.detail).join("; "))]));
    fill("streams", streams.map(s => [cell(s.id), cell(s.tenant),
      cell(s.primary || "unplaced", s.primary ? null : "bad"), cell(s.standby)]));
    const phaseClass = p => (p === "running" || p === "done" ? "ok"
                             : p === "blocked" ? "bad" : "warn");
    fill("jobs", jobs.map(j => [cell(j.id), cell(j.phase, phaseClass(j.phase)), cell(j.node),
      cell(j.step, null, true), cell(j.checkpoint_step, null, true),
      cell(j.takeovers, null, true), cell(j.why)]));
    fill("failovers", failovers.slice(-20).reverse().map(f => [cell(when(f.detected_unix_ms)),
      cell(f.node), cell(f.reason),
      cell(ms(f.fault_to_detected_ms) + (f.fault_seen_by ? " (" + f.fault_seen_by + ")" : ""),
           null, true), cell(ms(f.detected_to_fenced_ms), null, true),
      cell(ms(f.detected_to_routes_pushed_ms), null, true),
      cell(ms(f.detected_to_routers_acked_ms), null, true)]));
    fill("events", events.slice(-30).reverse().map(e => [cell(when(e.unix_ms)), cell(e.type),
      cell(e.node), cell(e.detail)]));
    const summary = document.getElementById("summary");
    summary.replaceChildren(...[
      "nodes up: " + nodes.filter(n => n.state === "alive").length + " / " + nodes.length,
      "streams: " + streams.length,
      "unplaced: " + capacity.unplaced_streams,
      "jobs blocked: " + jobs.filter(j => j.phase === "blocked").length,
      "headroom units: " + capacity.headroom_units,
      capacity.survives_node_loss ? "survives a node loss" : "NO N+1 HEADROOM"].map(t => {
        const s = document.createElement("span");
        s.textContent = t;
        if (t === "NO N+1 HEADROOM" || (t.startsWith("unplaced") && capacity.unplaced_streams > 0) ||
            (t.startsWith("jobs blocked") && !t.endsWith(": 0"))) s.className = "bad";
        return s;
      }));
    const st = document.getElementById("status");
    st.textContent = "updated " + new Date().toLocaleTimeString();
    st.className = "";
  } catch (err) {
    const st = document.getElementById("status");
    st.textContent = "API error: " + err.message;
    st.className = "bad";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)html";
}

}  // namespace gpuha::controller
