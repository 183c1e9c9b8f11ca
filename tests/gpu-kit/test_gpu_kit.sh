#!/usr/bin/env bash
# test_gpu_kit.sh SOURCE_DIR BUILD_DIR: the GPU kit proven on a machine without a GPU.
# 1. tools/gpu-kit/gpu-kit assembles a kit from BUILD_DIR (built already: --no-build),
#    under 48 MiB.
# 2. Its entry script runs in a mount namespace where SOURCE_DIR, BUILD_DIR and the system
#    copy of every library the kit carries are hidden (an empty file bound over each: the
#    loader then fails on it instead of falling back to it), so every program must resolve
#    from the kit: the steps that need no device pass, every device step says "no CUDA
#    device" and counts as skipped, the summary says so, well inside the budget.
# 3. The same run with one carried library taken out of the kit fails its resolve step,
#    naming the library.
set -euo pipefail
SRC=$(cd "$1" && pwd)
BUILD=$(cd "$2" && pwd)
WORK=$(mktemp -d /tmp/px-gpu-kit-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$SRC/tools/gpu-kit/gpu-kit" build "$WORK/kit" --build-dir "$BUILD" --no-build
KIT="$WORK/kit"
bytes=$(du -sb "$KIT" | awk '{print $1}')
echo "kit: $bytes bytes"
[ "$bytes" -le $((48 * 1024 * 1024)) ] || fail "the kit is $bytes bytes, over 48 MiB"
for f in run-gpu-checks MANIFEST bin/parallaxd bin/libparallax_gpu.so bin/pxctl bin/px-bench \
         bin/px-bench-gpu bin/px-cluster bin/px_gpu_tests bin/px_gpu_memory_tests \
         bin/px_gpu_worker lib/libparallax.so.1 python/parallax/__init__.py \
         checks/check_torch_cuda.py; do
  [ -e "$KIT/$f" ] || fail "the kit has no $f"
done
# Never carried: glibc, the C++ runtime, the CUDA driver/runtime and NCCL.
if ls "$KIT/lib" | grep -E '^(libc|libm|libstdc\+\+|libgcc_s|libcuda|libcudart|libnccl)\.so'; then
  fail "the kit carries a library that must come from the GPU machine"
fi
carried=$(ls "$KIT/lib" | grep -v '^libparallax\.so')
[ -n "$carried" ] || fail "the kit carries no library (libfabric, libuv, Cap'n Proto... expected)"
for lib in libfabric.so.1 libuv.so.1; do
  echo "$carried" | grep -qx "$lib" || fail "the kit does not carry $lib"
done

# The system copies of the carried libraries: what the loader would find without the kit.
hide=()
for lib in $carried; do
  while read -r path; do
    [ -e "$path" ] && hide+=("$(readlink -f "$path")")
  done < <(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF}')
done
[ ${#hide[@]} -gt 0 ] || fail "found no system copy of the carried libraries to hide"
printf '%s\n' "${hide[@]}" | sort -u >"$WORK/hidden"
echo "hiding $(wc -l <"$WORK/hidden") system libraries, $SRC and $BUILD"
: >"$WORK/empty"
mkdir -p "$WORK/void"

# in_namespace COMMAND...: COMMAND with the trees and the system copies hidden.
in_namespace() {
  local unshare=(unshare --mount --propagation private)
  [ "$(id -u)" -eq 0 ] || unshare=(unshare --user --map-root-user --mount --propagation private)
  "${unshare[@]}" bash -c '
    set -e
    work=$1; shift
    while read -r path; do mount --bind "$work/empty" "$path"; done <"$work/hidden"
    mount --bind "$work/void" "$2"
    mount --bind "$work/void" "$1"
    shift 2
    cd /
    exec "$@"' in_namespace "$WORK" "$SRC" "$BUILD" "$@"
}

# A hidden library really is gone in there (the check would prove nothing otherwise).
probe=$(head -1 "$WORK/hidden")
if in_namespace /usr/bin/python3 -c "import ctypes; ctypes.CDLL('$probe')" 2>/dev/null; then
  fail "$probe still loads inside the namespace"
fi

start=$(date +%s)
set +e
# One check on host tensors is enough to prove parallax.torch runs from the kit: all seven
# run from the tree in python/check-torch-cuda (the GPU machine runs them all from the kit).
in_namespace env PX_PYTHON=/usr/bin/python3 PX_KIT_HOST_CHECKS=embedding "$KIT/run-gpu-checks" \
  "$WORK/out"
rc=$?
set -e
seconds=$(($(date +%s) - start))
echo "run-gpu-checks: exit $rc in $seconds s"
[ -f "$WORK/out/summary.json" ] || fail "no summary.json"
cat "$WORK/out/summary.json"
ls "$WORK/out"
[ "$(ls "$WORK/out" | wc -l)" -le 8 ] || fail "more than 8 files in OUTDIR"
/usr/bin/python3 - "$WORK/out/summary.json" "$rc" "$seconds" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
rc, seconds = int(sys.argv[2]), int(sys.argv[3])
steps = {s["name"]: s for s in summary["steps"]}
host = ["resolve", "unit-host", "daemon-status", "python-host"]
device = ["unit-device", "integration-device", "bench", "python-cuda"]
problems = []
if summary["device"]:
    problems.append("the summary says there is a device here")
for name in host:
    if steps.get(name, {}).get("status") != "passed":
        problems.append(f"{name} should pass without a device: {steps.get(name)}")
for name in device:
    s = steps.get(name, {})
    if s.get("status") != "skipped" or "no CUDA device" not in s.get("detail", ""):
        problems.append(f"{name} should be skipped, saying no CUDA device: {s}")
host_checks = [c["name"] for c in json.load(open(sys.argv[1].replace("summary", "torch-host")))["checks"]]
if host_checks != ["embedding"]:
    problems.append(f"python-host ran {host_checks}, PX_KIT_HOST_CHECKS named embedding only")
if summary["failed"] or rc != 0:
    problems.append(f"exit {rc}, {summary['failed']} failed")
if seconds > 300:
    problems.append(f"took {seconds} s: the GPU machine's budget is 8 minutes with devices")
if problems:
    sys.exit("FAIL: " + "\n  ".join(problems))
print("without a device: host steps passed, device steps skipped, in", seconds, "s")
PY

# One carried library taken out: the resolve step fails and names it.
cp -a "$KIT" "$WORK/kit-short"
rm "$WORK/kit-short/lib/libuv.so.1"
set +e
in_namespace env PX_PYTHON=/usr/bin/python3 PX_KIT_STEPS=resolve,daemon-status \
  "$WORK/kit-short/run-gpu-checks" "$WORK/out-short" >"$WORK/short.log" 2>&1
rc=$?
set -e
cat "$WORK/short.log"
[ $rc -ne 0 ] || fail "a kit without libuv.so.1 passed"
grep -q '"name": "resolve"' "$WORK/out-short/summary.json" || fail "no resolve step"
/usr/bin/python3 - "$WORK/out-short/summary.json" <<'PY'
import json, sys
steps = {s["name"]: s for s in json.load(open(sys.argv[1]))["steps"]}
for name in ("resolve", "daemon-status"):
    assert steps[name]["status"] == "failed", steps[name]
assert "libuv.so.1" in steps["resolve"]["detail"], steps["resolve"]
print("without libuv.so.1 in the kit: resolve and daemon-status fail, naming it")
PY
echo "PASS"
