#!/usr/bin/env bash
# cmake --install of BUILD_DIR into a scratch prefix, then: the unit passes
# `systemd-analyze verify`; its ExecStart runs the installed parallaxd with the installed
# configuration, which --check-config accepts; systemd-sysusers makes the parallax user
# and group from the sysusers.d entry (in a scratch root); a reinstall keeps a configuration
# the operator edited.
set -euo pipefail
build=${1:?usage: test_unit_install.sh BUILD_DIR}
scratch=$(mktemp -d /tmp/pxt-unit-install-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
prefix=$scratch/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$scratch/install.log" || { cat "$scratch/install.log"; fail "cmake --install"; }
unit=$prefix/lib/systemd/system/parallaxd.service
config=$prefix/etc/parallax/parallaxd.toml
for f in "$unit" "$config" "$prefix/lib/sysusers.d/parallax.conf" "$prefix/etc/logrotate.d/parallaxd" \
         "$prefix/sbin/parallaxd"; do
  [ -e "$f" ] || fail "$f was not installed"
done

grep -qx "ExecStart=$prefix/sbin/parallaxd --config $config --foreground" "$unit" \
  || fail "ExecStart does not run the installed parallaxd with its configuration: $(grep ExecStart= "$unit")"
grep -qx "Type=notify" "$unit" || fail "the unit is not Type=notify"

command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (Debian: apt-get install systemd)"
# verify prints nothing for a clean unit; any warning fails the test.
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warned: $out"

# The example configuration loads; its group comes from sysusers.d, so name one that exists.
"$prefix/sbin/parallaxd" --config "$config" --group root --check-config >"$scratch/check.log" \
  || fail "--check-config rejected the installed configuration: $(cat "$scratch/check.log")"

root=$scratch/root
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$prefix/lib/sysusers.d/parallax.conf" >/dev/null 2>&1 \
  || fail "systemd-sysusers rejected parallax.conf"
grep -q '^parallax:x:[0-9]*:[0-9]*:Parallax communication daemon:/var/lib/parallax:' "$root/etc/passwd" \
  || fail "sysusers.d made no parallax user: $(cat "$root/etc/passwd")"
grep -q '^parallax:x:' "$root/etc/group" || fail "sysusers.d made no parallax group"

echo "# edited" >>"$config"
cmake --install "$build" --prefix "$prefix" >"$scratch/install2.log"
grep -q "^# edited" "$config" || fail "a reinstall replaced the edited configuration"
grep -q "Keeping: $config" "$scratch/install2.log" || fail "the reinstall did not say it kept $config"
echo "ok: unit verified, configuration checked, sysusers entry valid, edited configuration kept"
