"""What px-bench's Python model workers share (lm.py, dlrm.py): their place in the
tools/px-cluster job, torch.distributed's gloo group over its nodes for the DDP peers, and
each step's time made the slowest worker's, whichever system ran the step."""

from __future__ import annotations

import os
from typing import Callable, List, Tuple


def place() -> Tuple[int, int]:
    """(global rank, world size) from px-cluster's variables (ranks go node by node)."""
    per_node = int(os.environ["PX_CLUSTER_WORKERS_PER_NODE"])
    rank = int(os.environ["PX_CLUSTER_NODE"]) * per_node + int(os.environ["PARALLAX_LOCAL_RANK"])
    return rank, int(os.environ["PX_CLUSTER_NODES"]) * per_node


def init_gloo(rank: int, world: int, port: int) -> None:
    """torch.distributed's gloo group, rendezvous on the first node, over the cluster's
    interface (netns links)."""
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("PX_CLUSTER_IFACE", "lo"))
    master = os.environ["PX_CLUSTER_HOSTS"].split(",")[0]
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world)


def max_reducer(client, count: int) -> Callable[[List[float]], List[float]]:
    """values -> their maxima over every worker (count of them, the same on every worker):
    through a Parallax dense variable when client is a parallax.Client, else gloo's
    all_reduce. Called once, after the timed steps."""
    if client is not None:
        import numpy as np
        var = client.dense("bench.times", count, np.float64, op="max")

        def through_parallax(values):
            arr = np.array(values, dtype=np.float64)
            var.allreduce(arr).wait()
            return arr.tolist()
        return through_parallax
    import torch
    import torch.distributed as dist

    def through_gloo(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()
    return through_gloo
