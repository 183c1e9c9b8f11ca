#!/bin/sh
# Runs the crate's tests (cargo test --offline) against a parallaxd of its own.
#   clients/rust/run_tests.sh BUILD_DIR
# The daemon and libparallax come from BUILD_DIR (PARALLAXD and PARALLAX_LIB_DIR override
# them), cargo from $CARGO or PATH; cargo's output goes to BUILD_DIR/cargo-target so the
# source tree stays clean.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
crate=$(cd "$(dirname "$0")" && pwd)
daemon=${PARALLAXD:-$build/daemon/parallaxd}
libdir=${PARALLAX_LIB_DIR:-$build/clients/c}
cargo=${CARGO:-cargo}

# A socket of its own per run, so this test runs beside any other.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/px-rust-test.XXXXXX")
socket=$scratch/parallaxd.sock
pid=
cleanup() {
  status=$?
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ] && [ -s "$scratch/parallaxd.log" ]; then
    echo "--- parallaxd log ---" >&2
    cat "$scratch/parallaxd.log" >&2
  fi
  rm -rf "$scratch"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$daemon" --foreground --socket "$socket" --log-level warn >"$scratch/parallaxd.log" 2>&1 &
pid=$!
waited=0
while [ ! -S "$socket" ]; do
  if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge 100 ]; then
    echo "parallaxd did not start listening on $socket" >&2
    exit 1
  fi
  sleep 0.1
  waited=$((waited + 1))
done

cd "$crate"
PARALLAX_SOCKET=$socket PARALLAX_LIB_DIR=$libdir \
  LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  CARGO_TARGET_DIR=$build/cargo-target \
  timeout -k 10 500 "$cargo" test --offline
