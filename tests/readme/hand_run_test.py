#!/usr/bin/env python3
"""Runs the README's "Try a cluster by hand" lines as a new user would:

  hand_run_test.py SOURCE_DIR GPUHA_BINARY

The ```sh block after that heading is read from README.md, not copied here,
so the README cannot drift from what is tested. Each line runs from the
repository root with `build/gpuha` meaning GPUHA_BINARY. Lines that start a
daemon (controller, agent, router) run in the background, as in their own
terminals; every other line must exit 0, and is retried for up to 30 s the
way a user retries a command that the cluster was not ready for yet (a
stream added before any node has joined is refused with 409). The ports are
the README's fixed ones, so ctest runs this test alone (RUN_SERIAL).

While that cluster runs, every component's /metrics (controller, both
agents, router, both workers) goes through `promtool check metrics`
(Debian's prometheus package). Its only findings allowed are on names gpuha
keeps on purpose from other exporters: dcgm-exporter's label names on the
DCGM_FI_ families (UUID, modelName, Hostname), and the Triton and vLLM
families the worker serves as those servers do. Every gpuha and DCGM name
that the alert rules (deploy/prometheus) and the Grafana dashboard
(deploy/grafana) query must be among the families these pages export.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

DAEMONS = ("controller", "agent", "router")

# The README's fixed ports, and the viewer token of its controller config.
METRICS = [("controller", "http://127.0.0.1:7401/metrics"),
           ("agent gpu-1", "http://127.0.0.1:7402/metrics"),
           ("agent gpu-2", "http://127.0.0.1:7412/metrics"),
           ("router", "http://127.0.0.1:8081/metrics"),
           ("worker gpu-1", "http://127.0.0.1:8101/metrics"),
           ("worker gpu-2", "http://127.0.0.1:8102/metrics")]
TOKEN = "demo-viewer"
# Names kept from other exporters, so their dashboards and alerts work.
# dcgm-exporter's: its label names (UUID, modelName, Hostname) and its
# counters without _total (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, ..._ENERGY_CONSUMPTION),
# one with the type in its name (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).
FOREIGN = [
    (re.compile(r"^DCGM_FI_[A-Z_]+$"),
     {"label names should be written in 'snake_case' not 'camelCase'",
      'counter metrics should have "_total" suffix',
      "metric name should not include type 'counter'"}),
    (re.compile(r"^nv_inference_[a-z_]+$"), None),  # Triton's names
    (re.compile(r"^vllm:[a-z_]+$"), None),  # vLLM's names
]


def allowed(finding):
    name, _, message = finding.partition(" ")
    return any(p.match(name) and (m is None or message in m) for p, m in FOREIGN)


def queried_names(source):
    """The gpuha_* and DCGM_FI_* names the alert rules and dashboards query."""
    names = set()
    for d in ("deploy/prometheus", "deploy/grafana"):
        for f in sorted(os.listdir(os.path.join(source, d))):
            if f.endswith((".yaml", ".json")) and "test" not in f:
                text = open(os.path.join(source, d, f)).read()
                names |= set(re.findall(r"\b(gpuha_[a-z_]+|DCGM_FI_[A-Z_]+)\b", text))
    return names


def check_metrics(source):
    ok = True
    exported = set()
    for what, url in METRICS:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            text = urllib.request.urlopen(req, timeout=10).read()
        except OSError as e:
            print(f"FAIL     {what} {url}: {e}")
            ok = False
            continue
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           timeout=60)
        findings = [l for l in (r.stdout + r.stderr).decode().splitlines() if l.strip()]
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", text.decode(), re.M):
            exported.add(name)
            if kind == "histogram":
                exported |= {name + "_bucket", name + "_sum", name + "_count"}
        bad = [f for f in findings if not allowed(f)]
        families = text.count(b"# TYPE ")
        if bad or families == 0 or r.returncode not in (0, 3):
            print(f"FAIL     promtool check metrics, {what} ({families} families, "
                  f"rc {r.returncode}):\n  " + "\n  ".join(bad))
            ok = False
        else:
            print(f"ok       promtool check metrics, {what}: {families} families, "
                  f"{len(findings)} finding(s), all on names kept from other exporters")
    queried = queried_names(source)
    missing = sorted(queried - exported)
    if missing or not queried:
        print(f"FAIL     queried by the alert rules or the dashboard, exported by no "
              f"component: {missing}")
        ok = False
    else:
        print(f"ok       the {len(queried)} names the alert rules and the dashboard query "
              f"are all exported")
    return ok


def block(readme):
    text = open(readme).read()
    at = text.index("Try a cluster by hand")
    m = re.search(r"```sh\n(.*?)```", text[at:], re.S)
    return [l for l in m.group(1).splitlines() if l.strip() and not l.startswith("#")]


def main():
    source, gpuha = sys.argv[1], os.path.abspath(sys.argv[2])
    lines = block(os.path.join(source, "README.md"))
    if len(lines) < 5:
        print(f"FAIL the README's hand-run block has {len(lines)} lines")
        return 1
    procs = []
    logs = tempfile.mkdtemp(prefix="gpuha-readme-")
    ok = True
    try:
        for i, line in enumerate(lines):
            argv = [gpuha if a == "build/gpuha" else a.replace("build/gpuha ", gpuha + " ")
                    for a in shlex.split(line)]
            if argv[0] == gpuha and argv[1] in DAEMONS:
                log = open(os.path.join(logs, f"{i}-{argv[1]}.log"), "w")
                procs.append((line, subprocess.Popen(argv, cwd=source, stdout=log, stderr=log,
                                                     start_new_session=True), log.name))
                print(f"started  {line}", flush=True)
                continue
            deadline = time.monotonic() + 30
            while True:
                r = subprocess.run(argv, cwd=source, capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    print(f"ok       {line}\n{r.stdout.strip()[-1500:]}", flush=True)
                    break
                if time.monotonic() > deadline:
                    print(f"FAIL     {line}\n  rc {r.returncode}\n  stdout {r.stdout[-1500:]}\n"
                          f"  stderr {r.stderr[-1500:]}", flush=True)
                    ok = False
                    break
                time.sleep(0.5)
            if not ok:
                break
        for line, p, _ in procs:
            if p.poll() is not None:
                print(f"FAIL     exited early (rc {p.returncode}): {line}")
                ok = False
        if ok:
            ok = check_metrics(source)
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for line, p, log in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            if not ok:
                print(f"--- {line}\n{open(log).read()[-2000:]}")
    print("the README's hand-run steps work" if ok else "the README's hand-run steps failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
