#!/bin/sh
# Runs its arguments if this is root with network namespaces; else exits 77 (ctest: skipped).
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root"; exit 77; }
ip netns list >/dev/null 2>&1 || { echo "skipped: no network namespaces"; exit 77; }
exec "$@"
