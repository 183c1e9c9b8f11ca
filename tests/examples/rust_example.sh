#!/bin/sh
# Builds examples/rust with cargo (offline, its Cargo.lock as committed, into
# $CARGO_TARGET_DIR: the build tree, not the source tree), then runs the rest of the
# command line (the output check around px-cluster) with libparallax on the loader's path:
# a dependent crate's binary gets no rpath from the parallax crate's build script.
#   rust_example.sh COMMAND [ARGS...]
# Environment: CARGO (default cargo), PARALLAX_LIB_DIR (libparallax's folder),
# CARGO_TARGET_DIR.
set -eu
manifest=$(cd "$(dirname "$0")/../../examples/rust" && pwd)/Cargo.toml
"${CARGO:-cargo}" build --offline --locked --quiet --manifest-path "$manifest"
LD_LIBRARY_PATH=$PARALLAX_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
exec "$@"
