#!/usr/bin/env bash
# clang's thread-safety analysis (-Wthread-safety) over the sources whose
# locks carry abseil's annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED), with the build's own flags read from its
# compile_commands.json. The build compiles with GCC, which ignores the
# annotations; this makes them a check: a guarded field read without its
# lock, or a *Locked function called without it, fails the run, naming the
# file and line.
#   scripts/check-thread-safety.sh BUILD_DIR [SOURCE...]
# Without SOURCEs: every source of src/controller but its tests. ctest runs
# it (ThreadSafetyTest.ControllerLocksAreChecked).
set -euo pipefail
build="$(realpath "${1:?usage: check-thread-safety.sh BUILD_DIR [SOURCE...]}")"
shift
command -v clang++ >/dev/null || { echo "missing clang++: run scripts/install-deps.sh" >&2; exit 2; }
[[ -f "$build/compile_commands.json" ]] || { echo "no $build/compile_commands.json" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)"
if [[ $# -eq 0 ]]; then
  set -- $(cd "$here" && ls src/controller/*.cc | grep -v '_test\.cc$')
fi
python3 - "$build" "$here" "$@" <<'PY'
import json, os, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

build, here, files = sys.argv[1], sys.argv[2], sys.argv[3:]
commands = {}
for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
    commands[os.path.realpath(entry["file"])] = entry

def clang(path):
    entry = commands.get(os.path.realpath(os.path.join(here, path)))
    if entry is None:
        return path, 2, f"{path}: not in {build}/compile_commands.json\n"
    args = entry.get("arguments") or shlex.split(entry["command"])
    keep, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        # Only the analysis is asked for: GCC's warning set is the build's.
        if a in ("-c", "-MD", "-MMD", "-Werror") or a.startswith("-W"):
            continue
        keep.append(a)
    cmd = ["clang++", *keep, "-fsyntax-only", "-Wno-everything", "-Wthread-safety",
           "-Werror=thread-safety"]
    p = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
    return path, p.returncode, p.stderr

failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for path, rc, err in pool.map(clang, files):
        if rc != 0:
            failed += 1
            sys.stderr.write(err)
        print(f"{'FAIL' if rc else 'ok  '} {path}")
print(f"{len(files) - failed} of {len(files)} sources pass clang's thread-safety analysis")
sys.exit(1 if failed else 0)
PY
