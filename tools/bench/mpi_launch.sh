#!/usr/bin/env bash
# Launches px-mpi-allreduce with mpirun on the nodes px-cluster set up (run it with
# px-cluster --no-daemons --once). In netns mode mpirun runs in node 0's namespace and
# starts its daemons in the other namespaces through an rsh agent that maps each node's
# address to `ip netns exec NAMESPACE`, so MPI's traffic crosses the same limited links.
# usage: mpi_launch.sh BINARY SIZES ITERATIONS
set -euo pipefail
binary=$1; sizes=$2; iterations=$3
IFS=, read -r -a hosts <<<"$PX_CLUSTER_HOSTS"
per_node=${PX_CLUSTER_WORKERS_PER_NODE:-1}
ranks=$(( ${#hosts[@]} * per_node ))
work=$(mktemp -d /tmp/px-mpi.XXXX)
trap 'rm -rf "$work"' EXIT
common=(--allow-run-as-root --oversubscribe --mca btl tcp,self --bind-to none)
if [ -z "${PX_CLUSTER_NAMESPACES:-}" ]; then
  exec_args=("${common[@]}" --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np "$ranks")
  mpirun "${exec_args[@]}" "$binary" "$sizes" "$iterations"
  exit
fi
IFS=, read -r -a namespaces <<<"$PX_CLUSTER_NAMESPACES"
for h in "${hosts[@]}"; do echo "$h slots=$per_node"; done >"$work/hosts"
{
  echo '#!/bin/sh'
  echo '# rsh agent: HOST COMMAND... -> run COMMAND in HOST'"'"'s namespace'
  echo 'host=$1; shift'
  echo 'case "$host" in'
  for i in "${!hosts[@]}"; do echo "  ${hosts[$i]}) ns=${namespaces[$i]} ;;"; done
  echo '  *) echo "no namespace for $host" >&2; exit 1 ;;'
  echo 'esac'
  echo 'exec ip netns exec "$ns" sh -c "$*"'
} >"$work/rsh"
chmod +x "$work/rsh"
subnet="${hosts[0]%.*}.0/24"
mpirun "${common[@]}" --hostfile "$work/hosts" -np "$ranks" \
  --mca plm_rsh_agent "$work/rsh" --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  "$binary" "$sizes" "$iterations"
