#!/usr/bin/env bash
# A real Slurm: Debian's slurmctld and one slurmd per network namespace of a px-cluster
# netns cluster (started with --no-daemons --once, so this script runs in node 0's
# namespace), each slurmd with its own hostname (a UTS namespace, pxn0, pxn1) and address,
# munged for their credentials; all made, started and stopped here. Then
# examples/slurm/parallax.sbatch as a 2 nodes x 2 tasks job: one parallaxd per node, then
# two training steps of the demo's model at the same time in the one allocation.
# Checks: the job completes; each step trained on 2 nodes x 2 workers as a Parallax job of
# its own (slurm-JOB.STEP, on the same daemons); nothing of it is left running.
# PX_SLURM_KEEP=1 keeps the work folder (configuration, logs) for a look afterwards.
# usage (as root, from ctest): slurm_cluster.sh PARALLAXD LIBPARALLAX
set -u
DAEMON=$1
LIB=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for tool in slurmctld slurmd sbatch squeue scontrol munged; do
  command -v $tool >/dev/null || { echo "skipped: no $tool (slurmctld slurmd slurm-client munge)"; exit 77; }
done
unshare --uts --mount true 2>/dev/null || { echo "skipped: no UTS and mount namespaces here"; exit 77; }
# slurmd 22.05 needs a cgroup plugin even without cgroup confinement: each node gets the
# v1 freezer hierarchy in its own mount namespace (ip netns exec hides the host's).
unshare --mount sh -c 'mount -t tmpfs px-cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer &&
  mount -t cgroup -o freezer px-freezer /sys/fs/cgroup/freezer' 2>/dev/null ||
  { echo "skipped: the cgroup v1 freezer hierarchy cannot be mounted here"; exit 77; }
IFS=, read -r -a HOSTS <<<"$PX_CLUSTER_HOSTS"
IFS=, read -r -a NAMESPACES <<<"$PX_CLUSTER_NAMESPACES"
WORK=$(mktemp -d /tmp/px-slurm.XXXXXX)
chmod 755 "$WORK"
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log "$WORK"/out/*; do [ -f "$f" ] && { echo "--- $f" >&2; tail -30 "$f" >&2; }; done
  exit 1
}
# Everything this test started runs in the cluster's namespaces (processes outlive a deleted
# namespace): the job's steps and tasks, slurmstepd, slurmd, slurmctld, munged. All of them
# are stopped, but not this script and its ancestors (in node 0's).
stop_namespaces() {  # stop_namespaces SIGNAL
  local keep=" $$ " p=$$ pid ns
  while [ "$p" -gt 1 ]; do p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1); keep+="$p "; done
  for ns in "${NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [[ "$keep" == *" $pid "* ]] || kill "-$1" "$pid" 2>/dev/null
    done
  done
}
cleanup() {
  scancel --quiet --user=root 2>/dev/null
  stop_namespaces TERM
  sleep 1
  stop_namespaces KILL
  wait 2>/dev/null
  [ -n "${PX_SLURM_KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# munge: one key and one munged; every daemon reaches it through its socket's path.
dd if=/dev/urandom of="$WORK/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge.key"
munged -F -f --socket="$WORK/munge.sock" --key-file="$WORK/munge.key" \
  --pid-file="$WORK/munged.pid" --log-file="$WORK/munged.log" --seed-file="$WORK/munged.seed" &

# The nodes' names, resolved through a hosts file each daemon's mount namespace sees.
NODES=()
{
  echo "127.0.0.1 localhost"
  for i in "${!HOSTS[@]}"; do echo "${HOSTS[$i]} pxn$i"; NODES+=("pxn$i"); done
} >"$WORK/hosts"
CPUS=$(nproc)
mkdir -p "$WORK/state" "$WORK/out"
for i in "${!HOSTS[@]}"; do mkdir -p "$WORK/spool-pxn$i"; done
cat >"$WORK/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
EOF
cat >"$WORK/slurm.conf" <<EOF
ClusterName=px
# Job ids of this run's own (the sbatch script names sockets by job and node).
FirstJobId=$(( ($$ % 40000) * 100 + 1 ))
SlurmctldHost=pxn0(${HOSTS[0]})
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$((20000 + $$ % 10000))
SlurmdPort=$((30000 + $$ % 10000))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge.sock
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool-%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
NodeName=DEFAULT CPUs=$((CPUS * 4)) RealMemory=1000 State=UNKNOWN
EOF
for i in "${!HOSTS[@]}"; do echo "NodeName=pxn$i NodeAddr=${HOSTS[$i]}" >>"$WORK/slurm.conf"; done
echo "PartitionName=px Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=60 State=UP" \
  >>"$WORK/slurm.conf"
export SLURM_CONF=$WORK/slurm.conf

# as_node I COMMAND...: COMMAND in node I's network namespace, with hostname pxnI and the
# hosts file, in namespaces of its own that its children (the job's tasks) inherit.
as_node() {
  local i=$1; shift
  ip netns exec "${NAMESPACES[$i]}" unshare --uts --mount --propagation private \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" &&
           mount -t tmpfs px-cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer &&
           mount -t cgroup -o freezer px-freezer /sys/fs/cgroup/freezer &&
           shift 2 && exec "$@"' \
    as_node "$WORK/hosts" "pxn$i" "$@"
}
for _ in $(seq 1 50); do [ -S "$WORK/munge.sock" ] && break; sleep 0.1; done
as_node 0 slurmctld -D -i -f "$WORK/slurm.conf" >"$WORK/slurmctld.out" 2>&1 &
for i in "${!HOSTS[@]}"; do
  as_node "$i" slurmd -D -f "$WORK/slurm.conf" >"$WORK/slurmd-$i.out" 2>&1 &
done
# Every node idle before the job goes in.
for _ in $(seq 1 100); do
  idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')
  [ "$idle" = "${#HOSTS[@]}" ] && break
  sleep 0.1
done
[ "$idle" = "${#HOSTS[@]}" ] || { sinfo -N >&2; fail "the slurmds did not register"; }
echo "slurm: ${#HOSTS[@]} nodes idle: $(sinfo -h -N -o '%N' | paste -sd,)"

# The job: the docs' sbatch script, 2 nodes x 2 tasks, two training steps at once.
cd "$ROOT"
# px-cluster's PARALLAX_* would name every step's job: Slurm's variables must.
unset $(compgen -e | grep '^PARALLAX_')
export PYTHONPATH=$ROOT/clients/python PARALLAX_LIB=$LIB PARALLAXD=$DAEMON PX_CONCURRENT_STEPS=2
job=$(sbatch --parsable -o "$WORK/out/job.out" examples/slurm/parallax.sbatch \
        /usr/bin/python3 tools/lm/train.py --steps 12 --log-every 4 --eval-tokens 512) ||
  fail "sbatch refused the job"
echo "slurm: job $job submitted"
state=
deadline=$((SECONDS + 200))
while [ $SECONDS -lt $deadline ]; do
  state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 0.2
done
scontrol show job "$job" | grep -E "JobState|Reason" >&2
out=$(cat "$WORK/out/job.out" 2>/dev/null)
echo "$out"
[ "$state" = COMPLETED ] || fail "job $job ended ${state:-unknown}"
# Two steps, each a Parallax job of 2 nodes x 2 workers that trained 12 steps.
[ "$(grep -c 'parallax: 2 nodes x 2 workers' <<<"$out")" = 2 ] || fail "not two 2 x 2 trainings"
[ "$(grep -c 'trained 12 steps' <<<"$out")" = 2 ] || fail "not two finished trainings"
# Each training its own Parallax job, named by its step (the daemons' is another step).
names=$(grep -o "job 'slurm-$job\.[0-9]*': all 2 local workers connected" <<<"$out" |
        cut -d"'" -f2 | sort -u | wc -l)
[ "$names" = 2 ] || fail "the two steps were not two Parallax jobs slurm-$job.STEP ($names)"
# Nothing of the job left running anywhere.
for _ in $(seq 1 50); do
  pgrep -f "parallax-slurm-$job|tools/lm/train.py" >/dev/null || break
  sleep 0.1
done
if pgrep -af "parallax-slurm-$job|tools/lm/train.py"; then fail "processes of job $job left running"; fi
echo "slurm: job $job: two steps of 2 x 2 trained at once"
