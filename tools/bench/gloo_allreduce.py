#!/usr/bin/python3
"""PyTorch gloo all_reduce peer for px-bench allreduce: one process per worker.

Run under tools/px-cluster --no-daemons (rank = node x workers-per-node + local rank,
rendezvous on the first of PX_CLUSTER_HOSTS). Prints "RESULT gloo <bytes> <median> <min> <max>"
from rank 0: seconds over the iterations of each iteration's slowest rank (every rank's times
are max-reduced after the timed loop), as px-bench times every system.
Needs Debian's python3-torch, importable only from /usr/bin/python3.
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("PX_CLUSTER_IFACE", "lo"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def per_step_max(times):
    """Each step's time over every rank's (a MAX all_reduce, outside the timed region), sorted."""
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return sorted(t.tolist())


def main():
    sizes = [int(s) for s in sys.argv[1].split(",")]
    iterations = int(sys.argv[2])
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 29555
    per_node = int(os.environ.get("PX_CLUSTER_WORKERS_PER_NODE", "1"))
    rank = int(os.environ["PX_CLUSTER_NODE"]) * per_node + int(os.environ.get("PARALLAX_LOCAL_RANK", "0"))
    world = int(os.environ["PX_CLUSTER_NODES"]) * per_node
    master = os.environ["PX_CLUSTER_HOSTS"].split(",")[0]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(t)  # warm-up: connections, page faults
        times = []
        for _ in range(iterations):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        slowest = per_step_max(times)
        if rank == 0:
            print(f"RESULT gloo {size} {slowest[len(slowest) // 2]:.9f} {slowest[0]:.9f} "
                  f"{slowest[-1]:.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
