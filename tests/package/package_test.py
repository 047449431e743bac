#!/usr/bin/env python3
"""The .deb as a user gets it: built by CPack from the build tree, installed
by dpkg into a clean temporary root (dpkg --root), never onto this machine.

  package_test.py BUILD_DIR SOURCE_DIR

Checks, each failure naming what it saw:
  - gpuha_VERSION_ARCH.deb and its gpuha-dbgsym .ddeb are made, and the .deb's
    control names its library dependencies;
  - dpkg installs it into a clean root (twice); its postinst creates the
    agent's user (once), each unit can be enabled (systemctl --root), and
    removal runs prerm and postrm and keeps the user;
  - the installed tree holds the binary, the systemd units, the sysusers file,
    the bash completion, the examples, README and LICENSE;
  - the packaged binary carries no DWARF, and the .ddeb holds its debug info
    under its build-id;
  - the installed binary runs: --version, and `plan` on a packaged example;
  - Type=notify: the installed router and controller say READY=1 on
    $NOTIFY_SOCKET once they serve, and STOPPING=1 on SIGTERM;
  - `systemd-analyze verify --root` accepts each installed unit with no
    warning;
  - the packaged bash completion completes subcommands from the binary.
"""
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def notify_roundtrip(tmp, argv, name):
    """Starts argv with NOTIFY_SOCKET set; expects READY=1, then STOPPING=1."""
    path = os.path.join(tmp, name + ".notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=path)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        try:
            first = sock.recv(4096).decode()
        except socket.timeout:
            first = "(nothing in 20 s)"
        check(first.startswith("READY=1"), f"{name}: READY=1 on $NOTIFY_SOCKET (got {first!r})")
        check("STATUS=" in first, f"{name}: the READY message carries a STATUS line ({first!r})")
        proc.send_signal(signal.SIGTERM)
        try:
            second = sock.recv(4096).decode()
        except socket.timeout:
            second = "(nothing in 20 s)"
        check(second == "STOPPING=1", f"{name}: STOPPING=1 on SIGTERM (got {second!r})")
        rc = proc.wait(timeout=20)
        check(rc == 0, f"{name}: exits 0 on SIGTERM (rc {rc}; stderr {proc.stderr.read()[-400:]!r})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


def main():
    build, source = sys.argv[1], sys.argv[2]
    if os.geteuid() != 0:
        # dpkg installs as root only (CI runs as root; ctest counts this a skip).
        print("SKIP: dpkg --root installs as root only; run as root")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="gpuha-package-") as tmp:
        out = os.path.join(tmp, "out")
        r = run(["cpack", "--config", os.path.join(build, "CPackConfig.cmake"), "-B", out])
        if not check(r.returncode == 0, f"cpack builds the package ({r.stdout[-600:]}{r.stderr[-600:]})"):
            return
        debs = [f for f in os.listdir(out) if f.endswith(".deb")]
        ddebs = [f for f in os.listdir(out) if f.endswith(".ddeb")]
        check(len(debs) == 1 and re.fullmatch(r"gpuha_\d+\.\d+\.\d+_amd64\.deb", debs[0]) is not None,
              f"one gpuha_VERSION_amd64.deb ({debs})")
        check(len(ddebs) == 1 and ddebs[0].startswith("gpuha-dbgsym_"), f"one gpuha-dbgsym .ddeb ({ddebs})")
        if not debs or not ddebs:
            return
        deb = os.path.join(out, debs[0])
        print(f"     packages: {os.path.getsize(deb)} bytes .deb, "
              f"{os.path.getsize(os.path.join(out, ddebs[0]))} bytes .ddeb (debug info)")
        info = run(["dpkg-deb", "-f", deb, "Package", "Depends", "License"]).stdout
        check("Package: gpuha" in info, f"control: Package gpuha ({info!r})")
        check(re.search(r"Depends:.*libc6.*libgrpc", info) is not None,
              f"control: Depends lists the linked libraries ({info!r})")

        # Installed as dpkg installs it, into a clean root of its own: an
        # empty dpkg database, an /etc with only root, and systemd's own
        # targets and slices (what the systemd package puts there), so that
        # `systemctl enable` and `systemd-analyze verify` see the units as on
        # a host. The maintainer scripts run on this machine with $DPKG_ROOT
        # set (--force-script-chrootless, as mmdebstrap's chrootless mode
        # does); the libraries it depends on are not in that root
        # (--force-depends). A new install once had no user: the agent's
        # unit failed 217/USER until a reboot.
        root = os.path.join(tmp, "root")
        units_dir = os.path.join(root, "usr/lib/systemd/system")
        for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "etc", "usr/lib/systemd/system"]:
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for f in ["var/lib/dpkg/status", "var/lib/dpkg/available"]:
            open(os.path.join(root, f), "w").close()
        etc = os.path.join(root, "etc")
        with open(os.path.join(etc, "passwd"), "w") as f:
            f.write("root:x:0:0:root:/root:/bin/sh\n")
        with open(os.path.join(etc, "group"), "w") as f:
            f.write("root:x:0:\n")
        for f in glob.glob("/usr/lib/systemd/system/*.target") + glob.glob("/usr/lib/systemd/system/*.slice"):
            shutil.copy(f, units_dir, follow_symlinks=False)
        dpkg = ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends"]
        for attempt in (1, 2):  # a reinstall or upgrade finds the user there already
            r = run(dpkg + ["-i", deb])
            check(r.returncode == 0 and "Setting up gpuha" in r.stdout,
                  f"dpkg -i #{attempt} installs it into a clean root ({r.stdout[-400:]}{r.stderr[-400:]})")
        r = run(["dpkg", f"--root={root}", "-s", "gpuha"])
        check("Status: install ok installed" in r.stdout, f"dpkg says it is installed ({r.stdout[:200]!r})")
        for script in ["postinst", "prerm", "postrm"]:
            path = os.path.join(root, "var/lib/dpkg/info", "gpuha." + script)
            check(os.path.isfile(path) and os.access(path, os.X_OK),
                  f"the package runs a {script} (executable)")
        with open(os.path.join(etc, "passwd")) as f:
            users = [l.split(":") for l in f.read().splitlines()]
        agent = [u for u in users if u[0] == "gpuha"]
        check(len(agent) == 1 and agent[0][5] == "/var/lib/gpuha-agent",
              f"the install created the gpuha user once, home /var/lib/gpuha-agent ({users})")
        with open(os.path.join(etc, "group")) as f:
            check(any(l.startswith("gpuha:") for l in f.read().splitlines()), "and its group")
        # What the README says to do next: each unit can be enabled.
        units = ["gpuha-agent.service", "gpuha-controller.service", "gpuha-router.service"]
        r = run(["systemctl", f"--root={root}", "enable"] + units)
        check(r.returncode == 0, f"systemctl enable of the three units ({r.stderr[-400:]!r})")
        for name in units:
            check(os.path.islink(os.path.join(etc, "systemd/system/multi-user.target.wants", name)),
                  f"{name} is enabled (wanted by multi-user.target)")
        exe = os.path.join(root, "usr/bin/gpuha")
        for rel in ["usr/bin/gpuha",
                    "usr/lib/systemd/system/gpuha-agent.service",
                    "usr/lib/systemd/system/gpuha-controller.service",
                    "usr/lib/systemd/system/gpuha-router.service",
                    "usr/lib/sysusers.d/gpuha.conf",
                    "usr/share/bash-completion/completions/gpuha",
                    "usr/share/zsh/vendor-completions/_gpuha",
                    "usr/share/fish/vendor_completions.d/gpuha.fish",
                    "usr/share/doc/gpuha/examples/controller.yaml",
                    "usr/share/doc/gpuha/examples/agent.yaml",
                    "usr/share/doc/gpuha/examples/router.yaml",
                    "usr/share/doc/gpuha/README.md",
                    "usr/share/doc/gpuha/LICENSE",
                    "usr/share/doc/gpuha/copyright",  # Debian policy 12.5
                    "usr/share/doc/gpuha/changelog.Debian.gz"]:  # 12.7
            check(os.path.isfile(os.path.join(root, rel)), f"the package holds /{rel}")
        if not os.path.isfile(exe):
            return

        # Debug info: off the binary, into the .ddeb under the build-id.
        sections = run(["readelf", "-S", "-W", exe]).stdout
        check(".debug_info" not in sections, "the packaged binary carries no .debug_info")
        notes = run(["readelf", "-n", exe]).stdout
        m = re.search(r"Build ID: ([0-9a-f]{2})([0-9a-f]+)", notes)
        if check(m is not None, "the packaged binary has a build-id"):
            want = f"./usr/lib/debug/.build-id/{m.group(1)}/{m.group(2)}.debug"
            listing = run(["dpkg-deb", "-c", os.path.join(out, ddebs[0])]).stdout
            check(want in listing, f"the .ddeb holds {want}")
        size = os.path.getsize(exe)
        unstripped = os.path.getsize(os.path.join(build, "gpuha"))
        print(f"     binary: {unstripped} bytes in the build tree, {size} bytes packaged")
        check(size < unstripped, "the packaged binary is smaller than the build tree's")

        r = run([exe, "--version"])
        check(r.returncode == 0 and re.search(r"\d+\.\d+\.\d+", r.stdout) is not None,
              f"the installed binary runs: --version ({r.stdout!r} {r.stderr!r})")
        r = run([exe, "plan", os.path.join(root, "usr/share/doc/gpuha/examples/scenario-a-dedicated-no-san.yaml")])
        check(r.returncode == 0 and "N+" in r.stdout,
              f"the installed binary plans a packaged example (rc {r.returncode}, {r.stderr[-300:]!r})")

        # Type=notify, as systemd would see it.
        with open(os.path.join(tmp, "router.yaml"), "w") as f:
            f.write("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nthreads: 1\nauth: none\n")
        notify_roundtrip(tmp, [exe, "router", "--config", os.path.join(tmp, "router.yaml")], "router")
        with open(os.path.join(tmp, "controller.yaml"), "w") as f:
            f.write("nodes:\n  - { name: n1, role: active, capacity: 4 }\n"
                    "  - { name: n2, role: passive, capacity: 4 }\n"
                    "listen: { grpc: \"127.0.0.1:0\", http: \"127.0.0.1:0\" }\n")
        notify_roundtrip(tmp, [exe, "controller", "--config", os.path.join(tmp, "controller.yaml"),
                               "--store", os.path.join(tmp, "controller.db")], "controller")

        # systemd-analyze verify, in the installed root: the units as
        # installed, their ExecStart the installed binary.
        for name in units:
            with open(os.path.join(units_dir, name)) as f:
                check("/usr/bin/gpuha " in f.read(), f"{name}: ExecStart runs /usr/bin/gpuha")
            r = run(["systemd-analyze", "verify", f"--root={root}", name])
            said = (r.stdout + r.stderr).strip()
            check(r.returncode == 0 and said == "", f"systemd-analyze verify {name}: rc {r.returncode} {said!r}")

        # The packaged completion, against the installed binary.
        script = (f"source {os.path.join(root, 'usr/share/bash-completion/completions/gpuha')}; "
                  f"COMP_WORDS=({exe} ro); COMP_CWORD=1; _gpuha; echo \"${{COMPREPLY[@]}}\"; "
                  f"COMP_WORDS=({exe} router --con); COMP_CWORD=2; _gpuha; echo \"${{COMPREPLY[@]}}\"")
        r = run(["bash", "-c", script])
        check(r.stdout.split("\n")[:2] == ["router", "--config --controller"],
              f"bash completion: 'ro' -> router, 'router --con' -> its flags ({r.stdout!r} {r.stderr!r})")
        # zsh and fish: the files `gpuha completion` writes, for this binary's commands.
        for rel, shell in [("usr/share/zsh/vendor-completions/_gpuha", "zsh"),
                           ("usr/share/fish/vendor_completions.d/gpuha.fish", "fish")]:
            path = os.path.join(root, rel)
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                packaged = f.read()
            r = run([exe, "completion", shell])
            check(r.returncode == 0 and packaged == r.stdout,
                  f"/{rel} is what `gpuha completion {shell}` writes")

        # Removal: prerm and postrm run, the files go, the user stays
        # (Debian removes no system user: files it owns may remain).
        r = run(dpkg + ["-r", "gpuha"])
        check(r.returncode == 0, f"dpkg -r removes it ({r.stdout[-300:]}{r.stderr[-300:]})")
        check(not os.path.exists(exe) and not os.path.exists(os.path.join(units_dir, units[0])),
              "the binary and the units are gone")
        with open(os.path.join(etc, "passwd")) as f:
            check(any(l.startswith("gpuha:") for l in f.read().splitlines()), "the gpuha user stays")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        sys.exit(1)
    print("all checks passed")
