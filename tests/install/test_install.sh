#!/usr/bin/env bash
# Installs the build tree into a scratch prefix (cmake --install), builds a C99 example
# against it twice — with pkg-config and with find_package(Parallax) — and runs both
# against the installed parallaxd. Usage: test_install.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/pxt-install-XXXXXX)
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/parallax_c.h lib/libparallax.so.1 lib/pkgconfig/parallax.pc \
         lib/cmake/Parallax/ParallaxConfig.cmake sbin/parallaxd bin/px-cluster bin/px-run bin/px-demo; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done

# The ABI version the installed header declares: what pkg-config and the example must say.
abi=$(sed -n 's/^#define PX_ABI_VERSION_MAJOR \([0-9]*\)/\1/p' "$prefix/include/parallax_c.h").$(
  sed -n 's/^#define PX_ABI_VERSION_MINOR \([0-9]*\)/\1/p' "$prefix/include/parallax_c.h")

# 1. pkg-config
PKG_CONFIG_PATH=$prefix/lib/pkgconfig
export PKG_CONFIG_PATH
[ "$(pkg-config --modversion parallax)" = "$abi" ] ||
  { echo "FAIL: pkg-config version $(pkg-config --modversion parallax), the header's $abi"; exit 1; }
cc -std=c99 -pedantic -Wall -Werror "$here/example.c" $(pkg-config --cflags --libs parallax) \
   -Wl,-rpath,"$prefix/lib" -o "$work/example-pkgconfig"

# 2. find_package(Parallax)
cmake -S "$here/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_RPATH="$prefix/lib" >/dev/null
cmake --build "$work/consumer" >/dev/null

# Both against the installed daemon.
export PARALLAX_SOCKET=$work/parallaxd.sock PARALLAX_WAIT_FOR_DAEMON=1
"$prefix/sbin/parallaxd" --foreground --socket "$PARALLAX_SOCKET" --log-level warn &
daemon_pid=$!
for example in "$work/example-pkgconfig" "$work/consumer/example"; do
  out=$(PARALLAX_JOB="$(basename "$example")" timeout 60 "$example")
  [ "$out" = "ABI $abi result 1 2 3 4" ] || { echo "FAIL: $example printed '$out'"; exit 1; }
  # Captured, not piped: grep -q stops reading at its match, and under pipefail the SIGPIPE
  # that leaves ldd would fail the check now and then.
  libs=$(ldd "$example")
  grep -q "$prefix/lib/libparallax.so.1" <<<"$libs" ||
    { echo "FAIL: $example does not load the installed libparallax"; exit 1; }
done
# pxctl, installed beside px-cluster, asks the installed daemon.
[ -x "$prefix/bin/pxctl" ] || { echo "FAIL: bin/pxctl was not installed"; exit 1; }
status=$("$prefix/bin/pxctl" --json status)
grep -q "\"pid\":$daemon_pid," <<<"$status" ||
  { echo "FAIL: the installed pxctl could not ask the installed parallaxd"; exit 1; }
# A CUDA build installs the GPU backend under lib/parallax, where the installed daemon finds it.
if [ -e "$build/daemon/libparallax_gpu.so" ]; then
  [ -e "$prefix/lib/parallax/libparallax_gpu.so" ] ||
    { echo "FAIL: lib/parallax/libparallax_gpu.so was not installed"; exit 1; }
  # Found and loaded (its CUDA runtime and NCCL resolved without the build tree's RUNPATH):
  # what is left is the runtime's own answer, devices or why there are none.
  status=$("$prefix/bin/pxctl" --json status)
  grep -q -E '"gpu":"none: (no GPU backend|cannot load)' <<<"$status" &&
    { echo "FAIL: the installed parallaxd did not load the installed GPU backend:";
      "$prefix/bin/pxctl" --json status; exit 1; }
fi
# 3. The Python package, from the prefix only (no PARALLAX_LIB: it finds PREFIX/lib itself).
site=$(echo "$prefix"/lib/python3*/dist-packages)
[ -f "$site/parallax/__init__.py" ] || { echo "FAIL: the Python package was not installed"; exit 1; }
out=$(env -u PARALLAX_LIB PYTHONPATH="$site" PARALLAX_JOB=python PARALLAX_LOCAL_SIZE=1 \
      timeout 60 /usr/bin/python3 -c '
import numpy as np, parallax
with parallax.Client() as px:
    x = px.empty(4); x[:] = [1, 2, 3, 4]
    px.dense("v", 4).allreduce(x).wait()
    print(parallax.library_path, x.tolist())')
case "$out" in
  "$prefix/lib/libparallax.so.1 [1.0, 2.0, 3.0, 4.0]") ;;
  *) echo "FAIL: the installed Python package printed '$out'"; exit 1 ;;
esac
echo "install: pkg-config and find_package(Parallax) examples and the Python package ran against the installed parallaxd"
