#!/usr/bin/env python3
"""deploy/keepalived/keepalived.conf, run: two routers share one address.

Usage: keepalived_test.py SOURCE_DIR GPUHA GPUHA_TEST_BACKEND   (as root)

Three network namespaces on a bridge, as two router hosts and a client on
one segment: each router host runs a backend, `gpuha router` and Debian's
keepalived with the shipped file (its "site:" lines filled in). The client
opens a new connection to the shared address every 10 ms. The host that
holds the address dies (its router and keepalived, kill -9): new
connections must be served by the other router within 500 ms. It comes back
and takes the address back (the higher priority). Then its router alone is
killed: its readiness script gives the address away (within 3.5 s; on a
host's own network namespace the file's process tracking does it at once,
which a namespace cannot run). The figures are printed for bench/RESULTS.md.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SRC, GPUHA, BACKEND = sys.argv[1], sys.argv[2], sys.argv[3]
ID = str(os.getpid() % 100000)
LAN = "gpuha-kl-" + ID          # the client's namespace, with the bridge
HOSTS = ["gpuha-k1-" + ID, "gpuha-k2-" + ID]
BRIDGE = "gkb" + ID
VIP = "10.214.0.10"
KEY = "k1"
failures = []


def sh(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(argv), r.stderr.strip()))
    return r.stdout


def expect(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def netns_up():
    sh("ip", "netns", "add", LAN)
    sh("ip", "-n", LAN, "link", "set", "lo", "up")
    sh("ip", "-n", LAN, "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "-n", LAN, "addr", "add", "10.214.0.1/24", "dev", BRIDGE)
    sh("ip", "-n", LAN, "link", "set", BRIDGE, "up")
    for i, ns in enumerate(HOSTS):
        here, there = "gk%d%s" % (i + 1, ID), "gh%d%s" % (i + 1, ID)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", there,
           "netns", LAN)
        sh("ip", "-n", ns, "addr", "add", "10.214.0.%d/24" % (11 + i), "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", LAN, "link", "set", there, "master", BRIDGE)
        sh("ip", "-n", LAN, "link", "set", there, "up")
        del here


def netns_down():
    for ns in HOSTS + [LAN]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def keepalived_conf(shipped, i):
    """The shipped file with its "site:" values filled in for host i.

    Its process tracking goes: the kernel sends process events (netlink's
    proc connector) only to the host's first network namespace, and
    keepalived in any other faults the instance ("Failed to set/clear
    process event listen"). Here a router's death is seen by its readiness
    script instead, and a router host's death by its missed adverts.
    """
    text = re.sub(r"\nvrrp_track_process gpuha_router \{.*?\n\}\n", "\n", shipped, flags=re.S)
    text = re.sub(r"\n  track_process \{.*?\}\n", "\n", text, flags=re.S)
    if "track_process" in text or "vrrp_track_process" in text:
        raise RuntimeError("could not take the process tracking out of the shipped file")
    for site, here in (("priority 150", "priority %d" % (150 - 50 * i)),
                       ("192.0.2.10/24", VIP + "/24"),
                       ("http://127.0.0.1:8081/healthz", "http://127.0.0.1:9090/healthz")):
        if site not in text:
            raise RuntimeError("the shipped file has no '%s' to fill in" % site)
        text = text.replace(site, here, 1)
    return text


def router_config(path, backend_port):
    with open(path, "w") as f:
        f.write(
            "listen: 0.0.0.0:8080\nadmin: 127.0.0.1:9090\nthreads: 1\n"
            "tenants:\n  - name: acme\n    api_keys_sha256: [%s]\n"
            "routes:\n  - { stream: s1, tenant: acme, primary: \"127.0.0.1:%d\" }\n" %
            (sh(GPUHA, "ctl", "hash-token", KEY).strip(), backend_port))


def holds(i):
    """Whether router host i has the address on its interface."""
    return VIP + "/" in sh("ip", "-n", HOSTS[i], "addr", "show", "dev", "eth0")


def wait(pred, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


# The client, in the client's namespace: a new connection every 10 ms,
# each line "MONOTONIC_NS OK BACKEND" or "MONOTONIC_NS FAIL WHY".
CLIENT = r"""
import socket, sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.monotonic_ns()
    try:
        s = socket.create_connection((sys.argv[2], 8080), timeout=0.2)
        s.settimeout(1)
        s.sendall(b"GET /streams/s1/x HTTP/1.1\r\nHost: v\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
        s.close()
        head = data.split(b"\r\n\r\n")[0].decode()
        who = [l.split(":", 1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("x-backend:")]
        ok = head.startswith("HTTP/1.1 200")
        print(t, time.monotonic_ns(), "OK" if ok else "FAIL",
              who[0] if who and ok else head.split("\r\n")[0], flush=True)
    except OSError as e:
        print(t, time.monotonic_ns(), "FAIL", type(e).__name__, flush=True)
    time.sleep(0.01)
"""


def main():
    if os.geteuid() != 0:
        print("SKIP: needs root (network namespaces, VRRP)")
        return 77
    if shutil.which("keepalived") is None:
        print("FAIL: keepalived is not installed (scripts/install-deps.sh installs it)")
        return 1
    with open(os.path.join(SRC, "deploy/keepalived/keepalived.conf")) as f:
        shipped = f.read()
    # A Unix socket path is short; the folder holds everything else too.
    work = tempfile.mkdtemp(prefix="gpuha-kl-")
    procs = []
    routers = [None, None]
    keepaliveds = [None, None]

    def spawn(ns, argv, log):
        p = subprocess.Popen(["ip", "netns", "exec", ns] + argv, stdout=open(log, "ab"),
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    def start_router(i):
        routers[i] = spawn(HOSTS[i], [GPUHA, "router", "--config", "%s/router-%d.yaml" % (work, i + 1)],
                           "%s/router-%d.log" % (work, i + 1))

    def start_keepalived(i):
        for pid_file in ("keepalived", "vrrp"):  # a killed one's, which would stop this start
            try:
                os.unlink("%s/%s-%d.pid" % (work, pid_file, i + 1))
            except FileNotFoundError:
                pass
        keepaliveds[i] = spawn(HOSTS[i], ["keepalived", "-n", "-l", "-D", "-P", "-f",
                                          "%s/keepalived-%d.conf" % (work, i + 1),
                                          "-p", "%s/keepalived-%d.pid" % (work, i + 1),
                                          "-r", "%s/vrrp-%d.pid" % (work, i + 1)],
                               "%s/keepalived-%d.log" % (work, i + 1))

    def takeover_ms(kill, what, limit_ms):
        """Kills with `kill()` under the client's new connections; the time
        from the kill to the first one the second router's host served."""
        client = subprocess.Popen(["ip", "netns", "exec", LAN, "python3", "-c", CLIENT, "4", VIP],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        t0 = time.monotonic_ns()
        kill()
        out, _ = client.communicate(timeout=30)
        # Each attempt: its start, its end, what and who. One that ended
        # before the kill is before it; one in flight at the kill (reset by
        # it) is the takeover's.
        lines = [(int(t), int(end), w, who) for t, end, w, who in
                 (l.split(" ", 3) for l in out.splitlines() if l.strip())]
        before = [w for t, end, w, who in lines if end < t0]
        after = [(t, w, who) for t, end, w, who in lines if end >= t0]
        first_b = next((t for t, w, who in after if w == "OK" and who == "b"), None)
        failed = sum(1 for t, w, who in after if w != "OK")
        failed_before = ["%+.0f ms %s %s" % ((t - t0) / 1e6, w, who)
                         for t, end, w, who in lines if end < t0 and w != "OK"]
        expect(before and not failed_before,
               "%s: failed before the kill (%d of %d attempts; from the kill: %s)"
               % (what, len(failed_before), len(before), "; ".join(failed_before[:10])))
        expect(first_b is not None, what + ": no connection was served by the second router")
        ms = (first_b - t0) / 1e6 if first_b else float("nan")
        expect(first_b is not None and ms < limit_ms,
               "%s: the second router served new connections only %.0f ms after the kill "
               "(limit %d ms)" % (what, ms, limit_ms))
        expect(holds(1), what + ": the second router does not hold the address")
        print("FIGURES keepalived, %s: new connections through the address served by the other "
              "router after %.0f ms (%d attempts failed meanwhile, one every 10 ms)" % (what, ms, failed))
        return ms

    try:
        netns_up()
        for i, ns in enumerate(HOSTS):
            name = "ab"[i]
            spawn(ns, [BACKEND, "--name", name, "--port", "7101"], "%s/backend-%s.log" % (work, name))
            cfg = "%s/router-%d.yaml" % (work, i + 1)
            router_config(cfg, 7101)
            conf = "%s/keepalived-%d.conf" % (work, i + 1)
            with open(conf, "w") as f:
                f.write(keepalived_conf(shipped, i))
            os.chmod(conf, 0o600)
            start_router(i)
            start_keepalived(i)
        expect(wait(lambda: holds(0) and not holds(1), 15), "the first router did not take the address in 15 s")
        # Served through the address by the first router's host.
        probe = sh("ip", "netns", "exec", LAN, "python3", "-c", CLIENT, "0.5", VIP)
        expect(" OK a" in probe, "the address did not serve through the first router: " + probe[-300:])

        # The first router's host dies (its router and keepalived, kill -9):
        # three missed adverts, 0.1 s apart, and the second takes over.
        # (`ip netns exec` execs its command: the signal is the process's own.)
        # Its VRRP process first: killed alone, the parent would have it
        # send a priority-0 advert (a planned stop), which a dead host cannot.
        with open("%s/vrrp-1.pid" % work) as f:
            vrrp = int(f.read().strip())

        def host_dies():
            os.kill(vrrp, signal.SIGKILL)
            keepaliveds[0].send_signal(signal.SIGKILL)
            routers[0].send_signal(signal.SIGKILL)
        takeover_ms(host_dies, "kill -9 of the router host holding the address", 500)

        # It comes back and takes the address back (the higher priority)
        # once its router is ready (the script's rise: 2 s).
        start_router(0)
        start_keepalived(0)
        expect(wait(lambda: holds(0) and not holds(1), 15), "the first router did not take the address back")
        probe = sh("ip", "netns", "exec", LAN, "python3", "-c", CLIENT, "0.5", VIP)
        expect(" OK a" in probe, "the address did not serve through the first router again")

        # Its router alone killed: the readiness script fails (interval 1 s,
        # fall 2). On a host's own network namespace the process tracking
        # sees the exit at once instead; a namespace cannot run it.
        takeover_ms(lambda: routers[0].send_signal(signal.SIGKILL),
                    "kill -9 of the router process alone (seen by its readiness script)", 3500)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        netns_down()
        if failures:
            for name in sorted(os.listdir(work)):
                if name.endswith(".log"):
                    print("==== %s (last 30 lines)" % name)
                    with open(os.path.join(work, name), errors="replace") as f:
                        print("".join(f.readlines()[-30:]))
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("keepalived: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
