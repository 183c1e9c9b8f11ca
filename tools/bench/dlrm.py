#!/usr/bin/python3
"""px-bench dlrm: a DLRM-shaped recommender through Parallax and through PyTorch DDP on gloo.

Driver (what `px-bench dlrm` runs):
    dlrm.py [--nodes 4] [--workers-per-node 2] [--link-gbit 1]
            [--systems parallax,parallax-layers,ddp-sparse] [--batch 256] [--dim 16]
            [--max-rows 100000] [--steps 20] [--json]
runs each system on a fresh tools/px-cluster (netns nodes, rate-limited links) and prints one
JSON object. Worker (one process per worker, under px-cluster): dlrm.py --worker.

The model: Criteo's 26 categorical tables (Kaggle cardinalities capped at --max-rows, as
px-bench tables), 29 sum-pooled features (the three largest tables take two), one id per
feature per example drawn Zipf(1.0) within its table; 13 dense features through a bottom MLP
(13-64-dim); the pooled features and the bottom's output concatenated (DLRM's "cat"
interaction) through a top MLP (30 dim-64-1) to a logistic loss. Adagrad (lr 0.05) on the
tables, Adam on the MLPs. Systems:
  parallax         the tables in one parallax.torch.EmbeddingBagCollection (one pull and
                   one push step a training step), the MLPs through
                   parallax.torch.DistributedDataParallel
  parallax-layers  the same with one parallax.torch.EmbeddingBag per table (a pull and a
                   push per table a step)
  ddp-sparse       PyTorch DDP on gloo over the whole model, nn.EmbeddingBag(sparse=True) per
                   table: what #36 compares against
Per system: examples per second over the timed steps (each step's time is its slowest
worker's, max-reduced after the run), the step's median, min and max.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import bench_worker

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SYSTEMS = ("parallax", "parallax-layers", "ddp-sparse")
# Criteo Kaggle's C1..C26 cardinalities; the tables taking a second feature.
CRITEO_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
               3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
               142572)
SECOND_FEATURE = (2, 11, 20)


def args_of(argv):
    p = argparse.ArgumentParser(description="px-bench dlrm")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--system", default="parallax")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--nodes", default="4")
    p.add_argument("--workers-per-node", type=int, default=2)
    p.add_argument("--link-gbit", default="1", help="netns link rate; 0 unlimited")
    p.add_argument("--batch", type=int, default=256, help="examples per worker per step")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--max-rows", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--daemon", default=os.path.join(ROOT, "build", "daemon", "parallaxd"))
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def features(a):
    """[(feature name, table index)], 29 of them; and the tables' rows."""
    rows = [min(r, a.max_rows) for r in CRITEO_ROWS]
    feats = [(f"C{t + 1}", t) for t in range(len(rows))]
    feats += [(f"C{t + 1}.b", t) for t in SECOND_FEATURE]
    return feats, rows


# --- worker --------------------------------------------------------------------------
def worker(a) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
    import torch
    import torch.nn.functional as F
    from torch import nn
    torch.set_num_threads(1)

    rank, world = bench_worker.place()
    feats, rows = features(a)
    torch.manual_seed(0)  # the same initial MLPs on every worker

    class Body(nn.Module):
        """The dense part: bottom MLP, "cat" interaction, top MLP, logit."""

        def __init__(self):
            super().__init__()
            self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, a.dim),
                                        nn.ReLU())
            self.top = nn.Sequential(nn.Linear(a.dim * (len(feats) + 1), 64), nn.ReLU(),
                                     nn.Linear(64, 1))

        def forward(self, dense, pooled):
            return self.top(torch.cat([self.bottom(dense), pooled], dim=1)).squeeze(1)

    # Batches drawn before the timed steps: per feature one Zipf id per example.
    g = torch.Generator().manual_seed(1000 + rank)
    weights = {t: 1.0 / torch.arange(1, r + 1, dtype=torch.float64) for t, r in enumerate(rows)}
    batches = []
    for _ in range(a.warmup + a.steps):
        ids = [torch.multinomial(weights[t], a.batch, replacement=True, generator=g)
               for _, t in feats]
        batches.append((torch.randn(a.batch, 13, generator=g), ids,
                        torch.randint(0, 2, (a.batch,), generator=g).float()))
    offsets = torch.arange(a.batch)

    if a.system.startswith("parallax"):
        import parallax
        import parallax.torch as pxt
        client = parallax.Client(timeout=300, op_timeout=600)
        table_opts = dict(optimizer="adagrad", lr=0.05, client=client)
        if a.system == "parallax":
            sparse = pxt.EmbeddingBagCollection(
                [pxt.EmbeddingBagConfig(r, a.dim, f"T{t}",
                                        [f for f, ft in feats if ft == t])
                 for t, r in enumerate(rows)], name="dlrm", **table_opts)
            names = [f for f, _ in feats]
            keys = [f for t in range(len(rows)) for f, ft in feats if ft == t]  # tables' order

            def embed(ids):
                by_name = dict(zip(names, ids))
                kjt = pxt.KeyedJaggedTensor.from_lengths_sync(
                    keys, torch.cat([by_name[k] for k in keys]),
                    torch.ones(len(keys) * a.batch, dtype=torch.int64))
                return sparse(kjt).values()
        else:
            bags = [pxt.EmbeddingBag(r, a.dim, mode="sum", name=f"dlrm.T{t}", **table_opts)
                    for t, r in enumerate(rows)]

            def embed(ids):
                return torch.cat([bags[t](i, offsets) for (_, t), i in zip(feats, ids)], dim=1)
        body = pxt.DistributedDataParallel(Body(), client=client, name="dlrm.body")
        opt = torch.optim.Adam(body.parameters(), lr=1e-3)
        reduce_max = bench_worker.max_reducer(client, a.steps)
        barrier = lambda: client.barrier(600)

        def train(dense, ids, labels):
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(body(dense, embed(ids)), labels)
            loss.backward()
            opt.step()
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        bench_worker.init_gloo(rank, world, 29564)
        reduce_max = bench_worker.max_reducer(None, a.steps)

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.bags = nn.ModuleList(nn.EmbeddingBag(r, a.dim, mode="sum", sparse=True)
                                          for r in rows)
                self.body = Body()

            def forward(self, dense, ids):
                pooled = torch.cat([self.bags[t](i, offsets) for (_, t), i in zip(feats, ids)],
                                   dim=1)
                return self.body(dense, pooled)

        model = DDP(Model())
        opts = [torch.optim.Adagrad(model.module.bags.parameters(), lr=0.05),
                torch.optim.Adam(model.module.body.parameters(), lr=1e-3)]
        barrier = dist.barrier

        def train(dense, ids, labels):
            for o in opts:
                o.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
            loss.backward()
            for o in opts:
                o.step()

    step_times = []
    for i, batch in enumerate(batches):
        barrier()
        t0 = time.perf_counter()
        train(*batch)
        if i >= a.warmup:
            step_times.append(time.perf_counter() - t0)
    slowest = sorted(reduce_max(step_times))
    if rank == 0:
        median = slowest[len(slowest) // 2]
        print("RESULT " + json.dumps({
            "system": a.system, "workers": world, "examples_per_s": world * a.batch / median,
            "step_s": median, "step_s_min": slowest[0], "step_s_max": slowest[-1]}),
            flush=True)
    barrier()


# --- driver --------------------------------------------------------------------------
def driver(a) -> None:
    results = []
    for system in a.systems.split(","):
        link = [] if a.link_gbit == "0" else ["--link-gbit", a.link_gbit]
        cmd = [os.path.join(ROOT, "tools", "px-cluster"), "--nodes", a.nodes,
               "--workers-per-node", str(a.workers_per_node), "--mode", "netns", *link,
               "--timeout", "3000"]
        cmd += ["--daemon", a.daemon] if system.startswith("parallax") else ["--no-daemons"]
        cmd += ["--", sys.executable, os.path.abspath(__file__), "--worker", "--system", system,
                "--batch", str(a.batch), "--dim", str(a.dim), "--max-rows", str(a.max_rows),
                "--steps", str(a.steps), "--warmup", str(a.warmup)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            sys.stderr.write(f"px-bench dlrm: {system} failed ({p.returncode}):\n"
                             f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}\n")
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        results.append(r)
        if not a.json:
            print(f"{system:<16} {r['examples_per_s']:9.0f} examples/s  step {r['step_s']:.4f} s "
                  f"({r['step_s_min']:.4f}-{r['step_s_max']:.4f})", flush=True)
    if a.json:
        print(json.dumps({"scenario": "dlrm", "cores": os.cpu_count(), "nodes": int(a.nodes),
                          "workers_per_node": a.workers_per_node, "link_gbit": a.link_gbit,
                          "timing": "per step the slowest worker's time; median over steps",
                          "tables": len(CRITEO_ROWS), "features": len(features(a)[0]),
                          "max_rows": a.max_rows, "dim": a.dim, "batch_per_worker": a.batch,
                          "steps": a.steps, "results": results}))


if __name__ == "__main__":
    parsed = args_of(sys.argv[1:])
    worker(parsed) if parsed.worker else driver(parsed)
