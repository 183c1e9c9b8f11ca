#!/usr/bin/env bash
# tools/px-run over real ssh: Debian's sshd in each network namespace of a px-cluster
# netns cluster (started with --no-daemons --once, so this script runs in node 0's
# namespace), keys made here. Checks, on 3 hosts x 2 workers:
#   1. a job runs: a parallaxd per host started over ssh, 6 workers, exact allreduce;
#   2. a failing worker: px-run exits with its status and leaves nothing running;
#   3. SIGINT (Ctrl-C) while the workers run: exit 130, nothing left running.
# usage (as root, from ctest): px_run_ssh.sh PARALLAXD PX_TEST_WORKER
set -u
DAEMON=$1
WORKER=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SSHD=/usr/sbin/sshd
[ -x "$SSHD" ] || { echo "skipped: no $SSHD (openssh-server)"; exit 77; }
IFS=, read -r -a HOSTS <<<"$PX_CLUSTER_HOSTS"
IFS=, read -r -a NAMESPACES <<<"$PX_CLUSTER_NAMESPACES"
WORK=$(mktemp -d /tmp/px-run-ssh.XXXXXX)
SSHD_PIDS=()
fail() { echo "FAIL: $*" >&2; exit 1; }
cleanup() {
  for pid in "${SSHD_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# Keys: one host key for every sshd, one client key authorised for root.
ssh-keygen -q -t ed25519 -N '' -f "$WORK/host_key" || fail "ssh-keygen (host)"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/client_key" || fail "ssh-keygen (client)"
cp "$WORK/client_key.pub" "$WORK/authorized_keys"
mkdir -p /run/sshd  # sshd's privilege separation directory
for i in "${!HOSTS[@]}"; do
  cat >"$WORK/sshd_$i.conf" <<EOF
ListenAddress ${HOSTS[$i]}
Port 22
HostKey $WORK/host_key
PidFile $WORK/sshd_$i.pid
AuthorizedKeysFile $WORK/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
EOF
  ip netns exec "${NAMESPACES[$i]}" "$SSHD" -D -e -f "$WORK/sshd_$i.conf" \
    2>"$WORK/sshd_$i.log" &
  SSHD_PIDS+=($!)
done
export PX_RUN_SSH="ssh -i $WORK/client_key -o StrictHostKeyChecking=no \
-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=5"
# Every sshd answers before the job starts.
for h in "${HOSTS[@]}"; do
  for _ in $(seq 1 100); do
    $PX_RUN_SSH "$h" true 2>/dev/null && break
    sleep 0.1
  done
  $PX_RUN_SSH "$h" true || { cat "$WORK"/sshd_*.log >&2; fail "sshd on $h does not answer"; }
done
H="${HOSTS[0]}:2,${HOSTS[1]}:2,${HOSTS[2]}:2"

# The workers' sleeps carry this in their argv (the job's name is only in its daemons' and
# the wrapper shells'), so that a worker left running is seen too.
NAP=300.$$
leftovers() {  # leftovers JOB: processes of that job, or naps, still running 5 s on, anywhere
  set -- "$1|$NAP"
  for _ in $(seq 1 50); do
    pgrep -f -- "$1" >/dev/null || return 0
    sleep 0.1
  done
  pgrep -af -- "$1"
}

# 1. A job: daemons started over ssh, 2 workers per host, exact results.
out=$("$ROOT/tools/px-run" -H "$H" --daemon "$DAEMON" --job pxrun-ok-$$ --timeout 120 \
        -- env PX_TEST_EXACT=1 "$WORKER" allreduce --dtype f32 --op sum --count 100000 \
        --memory arena --steps 3 2>&1)
rc=$?
echo "$out" | tail -20
[ $rc -eq 0 ] || fail "the job exited $rc"
for node in 0 1 2; do
  for r in 0 1; do
    echo "$out" | grep -q "^\[$node.$r\] " || fail "no output from worker $node.$r"
  done
done
[ -z "$(leftovers pxrun-ok-$$)" ] || fail "left running after the job: $(leftovers pxrun-ok-$$)"
echo "ok: 3 hosts x 2 workers over ssh"

# 2. One worker fails: its status comes back, the others are stopped, nothing is left.
"$ROOT/tools/px-run" -H "$H" --daemon "$DAEMON" --job pxrun-fail-$$ --timeout 120 --grace 2 \
  -- sh -c 'if [ "$PARALLAX_LOCAL_RANK" = 1 ] && [ "$PARALLAX_SOCKET" != "${PARALLAX_SOCKET%node2.sock}" ]; then exit 7; fi; sleep "$1"' sh "$NAP" \
  >"$WORK/fail.log" 2>&1
rc=$?
[ $rc -eq 7 ] || { cat "$WORK/fail.log" >&2; fail "a failing worker: exit $rc, not 7"; }
grep -q "worker \[2.1\] .* exited with status 7" "$WORK/fail.log" || fail "no failure line"
[ -z "$(leftovers pxrun-fail-$$)" ] || fail "left running after a failure: $(leftovers pxrun-fail-$$)"
echo "ok: a failing worker's status, everything stopped"

# 3. Ctrl-C while the workers run.
"$ROOT/tools/px-run" -H "$H" --daemon "$DAEMON" --job pxrun-int-$$ -- sh -c 'echo started; sleep "$1"' sh "$NAP" \
  >"$WORK/int.log" 2>&1 &
run=$!
for _ in $(seq 1 200); do
  [ "$(grep -c started "$WORK/int.log")" -ge 6 ] && break
  sleep 0.1
done
[ "$(grep -c started "$WORK/int.log")" -ge 6 ] || { cat "$WORK/int.log" >&2; fail "workers not started"; }
kill -INT $run
wait $run
rc=$?
[ $rc -eq 130 ] || { cat "$WORK/int.log" >&2; fail "Ctrl-C: exit $rc, not 130"; }
[ -z "$(leftovers pxrun-int-$$)" ] || fail "left running after Ctrl-C: $(leftovers pxrun-int-$$)"
echo "ok: Ctrl-C stops every host's daemon and workers"
