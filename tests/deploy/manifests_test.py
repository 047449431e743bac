#!/usr/bin/env python3
"""Checks deploy/kubernetes for what an API server or kustomize would reject,
and what would deploy but not work, without a cluster:

  manifests_test.py SOURCE_DIR GPUHA_BINARY

- the kustomization lists every manifest in the folder, and each exists;
- each object's apiVersion and kind are known, its name a valid DNS name;
- workloads: selectors match the pod template's labels; container ports
  are named (IANA service names) and unique; probes name a port the
  container has, on a path the component's source serves; volume mounts
  name volumes; ConfigMaps, Secrets, Services and ServiceAccounts named
  by a workload exist; every flag the container passes to gpuha is one
  `gpuha SUBCOMMAND --help` lists;
- Services and PodDisruptionBudgets select a workload's pods, and a
  Service's target ports are ports those pods name;
- ServiceMonitors select a Service and scrape ports it names;
- RBAC bindings name a role and a service account that exist;
- every gpuha config carried in a ConfigMap or Secret passes
  `gpuha SUBCOMMAND --config FILE --check`.
Each failure names the file, the object and the field.
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

KNOWN = {
    ("v1", "Namespace"), ("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"), ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
}
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")
# Where each subcommand's HTTP paths are served from.
COMPONENT_SOURCES = {"agent": "src/agent", "controller": "src/controller", "router": "src/router"}

failures = []


def fail(where, what):
    failures.append(f"{where}: {what}")
    print(f"FAIL {where}: {what}", flush=True)


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def main():
    source, gpuha = sys.argv[1], sys.argv[2]
    # The base layout, file by file...
    folder = os.path.join(source, "deploy/kubernetes")
    objects, namespace = load_folder(folder, "kustomization.yaml")
    check(source, gpuha, objects, namespace)
    # ...and the overlay with three controllers on etcd, as kustomize renders it
    # (kubectl kustomize, no cluster).
    ha = os.path.join(source, "deploy/kubernetes-ha")
    _, ha_namespace = load_folder(ha, "kubernetes-ha/kustomization.yaml", base="../kubernetes")
    r = subprocess.run(["kubectl", "kustomize", ha], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail("kubernetes-ha", f"kubectl kustomize: {r.stderr.strip()[-600:]}")
    else:
        rendered = [("kubernetes-ha (rendered)", d) for d in yaml.safe_load_all(r.stdout) if d]
        check(source, gpuha, rendered, ha_namespace)
        check_ha(rendered)


def load_folder(folder, where, base=None):
    """The kustomization's resources, each a file of the folder (or `base`),
    and every manifest of the folder listed; its objects and namespace."""
    with open(os.path.join(folder, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    if kust.get("kind") != "Kustomization":
        fail(where, "kind is not Kustomization")
    listed = kust.get("resources", [])
    patched = [p["path"] for p in kust.get("patches", []) if "path" in p]
    present = sorted(f for f in os.listdir(folder) if f.endswith(".yaml") and f != "kustomization.yaml")
    for f in listed:
        if f != base and not os.path.isfile(os.path.join(folder, f)):
            fail(where, f"resources lists {f}, which does not exist")
    for f in present:
        if f not in listed and f not in patched:
            fail(where, f"{f} is neither in resources nor a patch")
    objects = []  # (file, doc)
    for f in present:
        if f in patched:
            continue
        with open(os.path.join(folder, f)) as fh:
            for doc in yaml.safe_load_all(fh):
                if doc is not None:
                    objects.append((f, doc))
    return objects, kust.get("namespace", "default")


def check_ha(objects):
    """What three controllers on etcd need to be one control plane."""
    by = {(o["kind"], o["metadata"]["name"]): o for _, o in objects}
    where = "kubernetes-ha (rendered)"
    ctrl = by.get(("StatefulSet", "gpuha-controller"))
    etcd = by.get(("StatefulSet", "gpuha-etcd"))
    if ctrl is None or etcd is None:
        fail(where, "no StatefulSet gpuha-controller or gpuha-etcd")
        return
    for sts, want in ((ctrl, 3), (etcd, 3)):
        if sts["spec"].get("replicas") != want:
            fail(where, f"StatefulSet {sts['metadata']['name']}: replicas is not {want}")
        aff = (sts["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity", {})
        if not aff.get("requiredDuringSchedulingIgnoredDuringExecution"):
            fail(where, f"StatefulSet {sts['metadata']['name']}: replicas may share a node")
    if ctrl["spec"].get("volumeClaimTemplates"):
        fail(where, "the controllers keep a ReadWriteOnce volume: a pod on a dead node holds it")
    config = yaml.safe_load(by[("Secret", "gpuha-controller")]["stringData"]["controller.yaml"])
    store = config.get("store") or {}
    if len(store.get("etcd", [])) != 3 or not all(e.startswith("https://") for e in store["etcd"]):
        fail(where, "the controllers' store is not the three etcd members over https")
    if not (store.get("tls") or {}).get("cert"):
        fail(where, "no client certificate for etcd (store.tls.cert)")
    args = " ".join(etcd["spec"]["template"]["spec"]["containers"][0].get("command", []))
    for flag in ("--client-cert-auth=true", "--peer-client-cert-auth=true", "--initial-cluster="):
        if flag not in args:
            fail(where, f"etcd runs without {flag}")
    router = by.get(("Deployment", "gpuha-router"))
    spec = router["spec"]["template"]["spec"] if router else {}
    if not (spec.get("affinity") or {}).get("podAntiAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or not spec.get("topologySpreadConstraints"):
        fail(where, "routers are not kept on different nodes and spread across zones")
    for name in ("gpuha-controller", "gpuha-etcd"):
        pdb = by.get(("PodDisruptionBudget", name))
        if pdb is None or pdb["spec"].get("minAvailable") != 2:
            fail(where, f"no PodDisruptionBudget {name} keeping two of three")


def check(source, gpuha, objects, namespace):

    by_kind = {}
    for f, o in objects:
        kind, api = o.get("kind"), o.get("apiVersion")
        name = (o.get("metadata") or {}).get("name", "")
        where = f"{f} {kind}/{name}"
        if (api, kind) not in KNOWN:
            fail(where, f"apiVersion {api!r} kind {kind!r} is not a known pair")
        if not DNS_SUBDOMAIN.match(name or ""):
            fail(where, f"metadata.name {name!r} is not a DNS subdomain")
        if kind == "Service" and not DNS_LABEL.match(name or ""):
            fail(where, f"a Service name must be a DNS label: {name!r}")
        by_kind.setdefault(kind, {})[name] = (f, o)

    def exists(kind, name):
        return name in by_kind.get(kind, {})

    # Workloads.
    config_flags = {}  # (kind, name) of a mounted config -> the flags its container passes
    pods = []  # (where, pod labels, {port name: number}, subcommand)
    for kind in WORKLOADS:
        for name, (f, o) in by_kind.get(kind, {}).items():
            where = f"{f} {kind}/{name}"
            spec = o.get("spec", {})
            selector = (spec.get("selector") or {}).get("matchLabels", {})
            template = spec.get("template", {})
            labels = (template.get("metadata") or {}).get("labels", {})
            if not labels_match(selector, labels):
                fail(where, f"spec.selector.matchLabels {selector} does not match the template's labels {labels}")
            pod = template.get("spec", {})
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for vname, v in volumes.items():
                if "configMap" in v and not exists("ConfigMap", v["configMap"]["name"]):
                    fail(where, f"volume {vname}: ConfigMap {v['configMap']['name']} is not defined")
                if "secret" in v and not exists("Secret", v["secret"]["secretName"]):
                    fail(where, f"volume {vname}: Secret {v['secret']['secretName']} is not defined")
            if kind == "StatefulSet":
                if not exists("Service", spec.get("serviceName", "")):
                    fail(where, f"spec.serviceName {spec.get('serviceName')!r} names no Service")
                for claim in spec.get("volumeClaimTemplates", []):
                    volumes[claim["metadata"]["name"]] = claim
            sa = pod.get("serviceAccountName")
            if sa and not exists("ServiceAccount", sa):
                fail(where, f"serviceAccountName {sa} is not defined")
            ports = {}
            subcommand = None
            for c in pod.get("containers", []):
                cwhere = f"{where} container {c.get('name')}"
                if not c.get("image"):
                    fail(cwhere, "no image")
                for p in c.get("ports", []):
                    pname = p.get("name")
                    if not pname or not PORT_NAME.match(pname):
                        fail(cwhere, f"port {p.get('containerPort')} needs a name of at most 15 lowercase characters: {pname!r}")
                    elif pname in ports:
                        fail(cwhere, f"port name {pname} is used twice")
                    else:
                        ports[pname] = p.get("containerPort")
                    if not isinstance(p.get("containerPort"), int):
                        fail(cwhere, f"port {pname}: containerPort is not a number")
                args = c.get("args", [])
                if c.get("image", "").split(":")[0] != "gpuha":
                    # Not ours (etcd): its ports and mounts are checked, not its flags.
                    for m in c.get("volumeMounts", []):
                        if m["name"] not in volumes:
                            fail(cwhere, f"volumeMount {m['name']} names no volume")
                    continue
                subcommand = args[0] if args else None
                # The config a container mounts is checked with its flags.
                for m in c.get("volumeMounts", []):
                    v = volumes.get(m["name"], {})
                    ref = ("Secret", v["secret"]["secretName"]) if "secret" in v else \
                        ("ConfigMap", v["configMap"]["name"]) if "configMap" in v else None
                    if ref:
                        config_flags[ref] = [a for a in args[1:] if not a.startswith("--config")]
                if subcommand not in COMPONENT_SOURCES:
                    fail(cwhere, f"args[0] {subcommand!r} is not a gpuha daemon subcommand")
                    continue
                help_text = subprocess.run([gpuha, subcommand, "--help"], capture_output=True, text=True).stdout
                for a in args[1:]:
                    flag = a.split("=", 1)[0]
                    if flag.startswith("--") and not re.search(r"(^|[\s,])" + re.escape(flag) + r"(?=[\s,=]|$)", help_text, re.M):
                        fail(cwhere, f"gpuha {subcommand} has no flag {flag}")
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    get = (c.get(probe) or {}).get("httpGet")
                    if not get:
                        continue
                    if get.get("port") not in ports and get.get("port") not in ports.values():
                        fail(cwhere, f"{probe}.httpGet.port {get.get('port')!r} is not a port of the container")
                    path = get.get("path", "")
                    src = os.path.join(source, COMPONENT_SOURCES[subcommand])
                    served = any(f'"{path}"' in open(os.path.join(src, x), errors="replace").read()
                                 for x in os.listdir(src) if x.endswith(".cc") and not x.endswith("_test.cc"))
                    if not served:
                        fail(cwhere, f"{probe}.httpGet.path {path!r} is not a path {src} serves")
                for m in c.get("volumeMounts", []):
                    if m["name"] not in volumes:
                        fail(cwhere, f"volumeMount {m['name']} names no volume")
            pods.append((where, labels, ports, subcommand))

    def selected(selector):
        return [p for p in pods if labels_match(selector, p[1])]

    for name, (f, o) in by_kind.get("Service", {}).items():
        where = f"{f} Service/{name}"
        targets = selected(o["spec"].get("selector", {}))
        if not targets:
            fail(where, f"spec.selector {o['spec'].get('selector')} selects no workload's pods")
        for p in o["spec"].get("ports", []):
            if not p.get("name") or not PORT_NAME.match(p["name"]):
                fail(where, f"port {p.get('port')} needs a name")
            t = p.get("targetPort", p.get("port"))
            for pod in targets:
                if t not in pod[2] and t not in pod[2].values():
                    fail(where, f"targetPort {t!r} is not a port of {pod[0]}")
    for name, (f, o) in by_kind.get("PodDisruptionBudget", {}).items():
        if not selected((o["spec"].get("selector") or {}).get("matchLabels", {})):
            fail(f"{f} PodDisruptionBudget/{name}", "its selector matches no workload's pods")
    for name, (f, o) in by_kind.get("ServiceMonitor", {}).items():
        where = f"{f} ServiceMonitor/{name}"
        sel = (o["spec"].get("selector") or {}).get("matchLabels", {})
        services = [s for s in by_kind.get("Service", {}).values()
                    if labels_match(sel, (s[1].get("metadata") or {}).get("labels", {}))]
        if not services:
            fail(where, f"selector {sel} matches no Service's labels")
        for e in o["spec"].get("endpoints", []):
            for s in services:
                if e.get("port") not in [p.get("name") for p in s[1]["spec"].get("ports", [])]:
                    fail(where, f"endpoint port {e.get('port')!r} is not a port name of Service {s[1]['metadata']['name']}")
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        for name, (f, o) in by_kind.get(kind, {}).items():
            where = f"{f} {kind}/{name}"
            ref = o.get("roleRef", {})
            if ref.get("kind") != role_kind and not (kind == "RoleBinding" and ref.get("kind") == "ClusterRole"):
                fail(where, f"roleRef.kind {ref.get('kind')!r}")
            if not exists(ref.get("kind"), ref.get("name")):
                fail(where, f"roleRef names {ref.get('kind')}/{ref.get('name')}, which is not defined")
            for s in o.get("subjects", []):
                if s.get("kind") == "ServiceAccount":
                    if not exists("ServiceAccount", s.get("name")):
                        fail(where, f"subject ServiceAccount {s.get('name')} is not defined")
                    if s.get("namespace") != namespace:
                        fail(where, f"subject namespace {s.get('namespace')!r} is not {namespace!r}")

    # The gpuha configs the manifests carry, checked by gpuha itself.
    with tempfile.TemporaryDirectory(prefix="gpuha-manifests-") as tmp:
        for kind in ("ConfigMap", "Secret"):
            for name, (f, o) in by_kind.get(kind, {}).items():
                data = dict(o.get("data") or {}, **(o.get("stringData") or {}))
                for key, text in data.items():
                    m = re.fullmatch(r"(agent|controller|router)\.yaml", key)
                    if not m:
                        continue
                    path = os.path.join(tmp, key)
                    with open(path, "w") as fh:
                        fh.write(text)
                    # The container's flags, with what the kubelet puts in
                    # $(VAR) from the downward API.
                    values = {"POD_IP": "10.0.0.7", "NODE_IP": "10.0.0.5",
                              "NODE_NAME": "gpu-node-1", "GPUHA_ROLE": "active"}
                    flags = [re.sub(r"\$\((\w+)\)", lambda v: values.get(v.group(1), v.group(0)), a)
                             for a in config_flags.get((kind, name), [])]
                    argv = [gpuha, m.group(1), "--config", path, "--check"] + flags
                    if m.group(1) == "agent":
                        # What the DaemonSet mounts from the join Secret.
                        token = os.path.join(tmp, "join-token")
                        with open(token, "w") as fh:
                            fh.write("a-join-token\n")
                        argv += ["--join-token-file", token]
                    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
                    if r.returncode != 0:
                        fail(f"{f} {kind}/{name} {key}", f"gpuha {m.group(1)} --check: rc {r.returncode}: {r.stderr.strip()[-400:]}")
                    else:
                        print(f"ok   {f} {kind}/{name} {key}: gpuha {m.group(1)} --check passes")

    # The agent's DaemonSet as a GPU node needs it (issue: it once had no
    # hostPID, /dev/kmsg in an unprivileged container, NVML through an env
    # var the runtime may ignore, nothing waiting for the driver, and DCGM
    # series beside dcgm-exporter's).
    agent = by_kind.get("DaemonSet", {}).get("gpuha-agent")
    if agent is None:
        fail("agent.yaml", "no DaemonSet gpuha-agent")
    else:
        f, o = agent
        where = f"{f} DaemonSet/gpuha-agent"
        pod = o["spec"]["template"]["spec"]
        if pod.get("hostPID") is not True:
            fail(where, "hostPID is not true: an XID's PID is the host's (XID attribution)")
        if pod.get("runtimeClassName") != "nvidia":
            fail(where, "runtimeClassName is not nvidia: no NVML from the host")
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            sc = c.get("securityContext", {})
            if sc.get("privileged") is not True:
                fail(where, f"container {c['name']} is not privileged: the runtime may ignore "
                            "NVIDIA_VISIBLE_DEVICES, and the device cgroup refuses /dev/kmsg")
            if sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False:
                fail(where, f"container {c['name']}: privileged with allowPrivilegeEscalation "
                            "false is refused by the API server")
        waits = [c for c in pod.get("initContainers", []) if "doctor" in " ".join(c.get("command", []))]
        if not waits:
            fail(where, "no init container waits for the driver (gpuha doctor until NVML answers)")
        config = yaml.safe_load(by_kind["ConfigMap"]["gpuha-agent"][1]["data"]["agent.yaml"])
        if (config.get("metrics") or {}).get("dcgm_names") is not False:
            fail(where, "metrics.dcgm_names is not false: every GPU series would come twice "
                        "beside the GPU Operator's dcgm-exporter")

    # The PrometheusRule carries the shipped alert rules, unchanged; the
    # ServiceMonitors and it carry the label kube-prometheus-stack selects.
    rule = by_kind.get("PrometheusRule", {}).get("gpuha")
    with open(os.path.join(source, "deploy/prometheus/gpuha-alerts.yaml")) as fh:
        shipped = yaml.safe_load(fh)
    if rule is None:
        fail("monitoring.yaml", "no PrometheusRule gpuha")
    elif rule[1]["spec"].get("groups") != shipped["groups"]:
        fail(f"{rule[0]} PrometheusRule/gpuha",
             "spec.groups differ from deploy/prometheus/gpuha-alerts.yaml: copy them over")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        for name, (f, o) in by_kind.get(kind, {}).items():
            if "release" not in ((o.get("metadata") or {}).get("labels") or {}):
                fail(f"{f} {kind}/{name}", "no `release` label: kube-prometheus-stack selects by it")

    print(f"{len(objects)} objects checked")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} problem(s)")
        sys.exit(1)
    print("all checks passed")
