#!/usr/bin/python3
"""PyTorch gloo sparse all_reduce peer for px-bench sparse: one process per worker.

Usage (under tools/px-cluster --no-daemons): gloo_sparse.py ROWS DIM LOOKUPS DENSE_BYTES STEPS
Each rank builds the same LM1B-shaped gradient px-bench's workers push: LOOKUPS Zipf(1.0)
rows of a ROWS x DIM table, uncoalesced, as a sparse COO tensor, and all_reduces it (what
Horovod-style systems do with sparse gradients). Prints "RESULT gloo-sparse <median> <min> <max>"
from rank 0: seconds over the steps of each step's slowest rank (every rank's step times are
max-reduced after the timed steps), as px-bench times every system.
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("PX_CLUSTER_IFACE", "lo"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    rows, dim, lookups, _dense, steps = (int(x) for x in sys.argv[1:6])
    per_node = int(os.environ.get("PX_CLUSTER_WORKERS_PER_NODE", "1"))
    rank = int(os.environ["PX_CLUSTER_NODE"]) * per_node + int(os.environ.get("PARALLAX_LOCAL_RANK", "0"))
    world = int(os.environ["PX_CLUSTER_NODES"]) * per_node
    master = os.environ["PX_CLUSTER_HOSTS"].split(",")[0]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29561", rank=rank, world_size=world)
    weights = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64)
    generator = torch.Generator().manual_seed(rank + 1)
    # Every batch's lookups are drawn before the first step, as px-bench's workers do (on one
    # machine a rank sampling between steps would take CPU from another rank's step in
    # flight); each step's gradient is built just before it, as before a real all_reduce.
    indices = [torch.multinomial(weights, lookups, replacement=True, generator=generator)
               for _ in range(steps + 1)]
    times = []
    for step, index in enumerate(indices):
        grad = torch.sparse_coo_tensor(index.unsqueeze(0), torch.full((lookups, dim), 1e-3),
                                       (rows, dim))
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(grad)
        if step > 0:  # the first one sets up connections
            times.append(time.perf_counter() - start)
    # Outside the timed region: each step's time is that of its slowest rank.
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    slowest = sorted(slowest.tolist())
    if rank == 0:
        print(f"RESULT gloo-sparse {slowest[len(slowest) // 2]:.6f} {slowest[0]:.6f} "
              f"{slowest[-1]:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
