#!/usr/bin/python3
"""px-bench lm: the language model, LM1B-shaped, through Parallax and through PyTorch DDP.

Driver (what `px-bench lm` runs):
    lm.py [--nodes 2,4] [--workers-per-node 2] [--link-gbit 1] [--systems parallax,ddp-dense,
          ddp-sparse] [--vocab 800000] [--tokens 8192] [--steps 20] [--json] ...
runs, for each N, each system on a fresh px-cluster (netns nodes, rate-limited links) and
prints one JSON object. Worker (one process per worker, under px-cluster): lm.py --worker.

The model is tools/lm/model.py's (the demo's): a sparse input embedding, an LSTM and a
projection, a sampled-softmax output table, both tables vocab x ~embed. Tokens are a
synthetic Zipf(1.0) stream, `tokens` per worker per step (drawn before the timed steps).
Systems:
  parallax    both tables in the daemons (pull/push, daemon-side Adagrad); the dense body
              through parallax.torch.DistributedDataParallel (25 MB buckets, prioritized:
              the first parameters' bucket first on the links; README, "Priorities")
  parallax-fifo  the same with prioritize=False: every transfer at priority 0 (FIFO)
  parallax-prefetch  parallax with prefetch: each step's rows of both tables pulled during
              the previous step's backward (parallax.torch.TrainPipeline, px_prefetch_rows)
  parallax-fifo-prefetch  prefetch without priorities
  ddp-dense   PyTorch DDP on gloo, nn.Embedding with dense, whole-table gradients
  ddp-sparse  PyTorch DDP on gloo, nn.Embedding(sparse=True) for both tables
Per system, per step: the step time (every worker's, max-reduced after the run: a step
ends when its slowest worker finishes) and the compute time: the same workers running
the same model with communication switched off (DDP's no_sync(); for Parallax the same
model with local sparse tables, as ddp-sparse's under no_sync), in the same run,
interleaved with the timed steps. Exposed communication = median step - median compute.
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
SYSTEMS = ("parallax", "ddp-dense", "ddp-sparse")
# The last three are not in the default --systems.
PARALLAX_SYSTEMS = ("parallax", "parallax-fifo", "parallax-prefetch", "parallax-fifo-prefetch")


def args_of(argv):
    p = argparse.ArgumentParser(description="px-bench lm")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--system", default="parallax")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--nodes", default="2,4")
    p.add_argument("--workers-per-node", type=int, default=2)
    p.add_argument("--link-gbit", default="1", help="netns link rate; 0 unlimited, lo loopback")
    p.add_argument("--vocab", type=int, default=800_000)
    p.add_argument("--tokens", type=int, default=8192, help="per worker per step")
    p.add_argument("--bptt", type=int, default=32)
    p.add_argument("--embed", type=int, default=64)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--sampled", type=int, default=256)
    p.add_argument("--steps", type=int, default=20, help="timed steps (and as many compute)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--daemon", default=os.path.join(ROOT, "build", "daemon", "parallaxd"))
    p.add_argument("--json", action="store_true")
    p.add_argument("--logs", default="")
    return p.parse_args(argv)


# --- worker --------------------------------------------------------------------------
def zipf_batches(a, rank: int, count: int):
    import torch
    weights = 1.0 / torch.arange(1, a.vocab + 1, dtype=torch.float64)
    g = torch.Generator().manual_seed(1000 + rank)
    seqs = a.tokens // a.bptt
    out = []
    for _ in range(count):
        ids = torch.multinomial(weights, seqs * (a.bptt + 1), replacement=True, generator=g)
        ids = ids.reshape(seqs, a.bptt + 1)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def worker(a) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, os.path.join(ROOT, "tools", "lm"))
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
    import torch
    torch.set_num_threads(1)
    from model import LMConfig, ParallaxLM, ReferenceLM

    rank, world = bench_worker.place()
    prefetch = a.system.endswith("-prefetch")
    cfg = LMConfig(vocab=a.vocab, embed=a.embed, hidden=a.hidden, num_sampled=a.sampled,
                   prefetch=prefetch)
    batches = zipf_batches(a, rank, a.warmup + a.steps)

    # Parallax's compute-only model: the same math with local sparse tables, no daemon (the
    # peers' compute steps are their own model under DDP's no_sync()). Compute steps train
    # too, so losses are not comparable across systems; only times are reported.
    if a.system in PARALLAX_SYSTEMS:
        local = ReferenceLM(cfg, sparse_grads=True)
        local_opts = local.optimizers()

    if a.system in PARALLAX_SYSTEMS:
        import parallax
        import parallax.torch as pxt
        client = parallax.Client(timeout=300, op_timeout=600)
        model = ParallaxLM(cfg, client, load_initial=False)
        model.body = pxt.DistributedDataParallel(model.body, client=client, name="lm.body",
                                                 prioritize="fifo" not in a.system)
        opts = [torch.optim.Adam(model.body.parameters(), lr=cfg.dense_lr)]
        reduce_max = bench_worker.max_reducer(client, 2 * a.steps)
        barrier = lambda: client.barrier(600)
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        bench_worker.init_gloo(rank, world, 29563)
        reduce_max = bench_worker.max_reducer(None, 2 * a.steps)
        ref = ReferenceLM(cfg, sparse_grads=(a.system == "ddp-sparse"))
        opts = ref.optimizers()
        model = DDP(ref, bucket_cap_mb=25, gradient_as_bucket_view=a.system == "ddp-dense")
        barrier = dist.barrier

    def step(m, optimizers, x, y):
        for o in optimizers:
            o.zero_grad()
        loss = m(x, y)
        loss.backward()
        for o in optimizers:
            o.step()
        return loss.item()

    if prefetch:  # each next batch taken ahead, its rows pulled while backward runs
        pipeline = pxt.TrainPipeline(model, opts, forward=lambda m, batch: m(*batch),
                                     prefetch=lambda batch: model.prefetch(*batch))
        ahead = iter(batches)
    step_times, compute_times = [], []
    for i, (x, y) in enumerate(batches):
        barrier()
        t0 = time.perf_counter()
        if prefetch:
            pipeline.progress(ahead).item()
        else:
            step(model, opts, x, y)
        t_step = time.perf_counter() - t0
        barrier()
        t0 = time.perf_counter()
        if a.system in PARALLAX_SYSTEMS:
            step(local, local_opts, x, y)
        else:
            with model.no_sync():  # the definition for the peers
                step(model, opts, x, y)
        t_compute = time.perf_counter() - t0
        if i >= a.warmup:
            step_times.append(t_step)
            compute_times.append(t_compute)
    slowest = reduce_max(step_times + compute_times)
    if rank == 0:
        steps, compute = sorted(slowest[:a.steps]), sorted(slowest[a.steps:])
        med = lambda v: v[len(v) // 2]
        words = world * a.tokens
        print("RESULT " + json.dumps({
            "system": a.system, "workers": world, "words_per_s": words / med(steps),
            "step_s": med(steps), "step_s_min": steps[0], "step_s_max": steps[-1],
            "compute_s": med(compute), "compute_s_min": compute[0],
            "compute_s_max": compute[-1], "exposed_comm_s": med(steps) - med(compute),
            "comm_share": (med(steps) - med(compute)) / med(steps)}), flush=True)
    barrier()


# --- driver --------------------------------------------------------------------------
def driver(a) -> None:
    results = []
    for n in [int(x) for x in a.nodes.split(",")]:
        for system in a.systems.split(","):
            mode = (["--mode", "loopback"] if a.link_gbit == "lo" else
                    ["--mode", "netns"] + ([] if a.link_gbit == "0" else
                                           ["--link-gbit", a.link_gbit]))
            cmd = [os.path.join(ROOT, "tools", "px-cluster"), "--nodes", str(n),
                   "--workers-per-node", str(a.workers_per_node), *mode, "--timeout", "3000"]
            if system in PARALLAX_SYSTEMS:
                cmd += ["--daemon", a.daemon]
            else:
                cmd += ["--no-daemons"]
            if a.logs:
                cmd += ["--logs", os.path.join(a.logs, f"{system}-n{n}")]
            cmd += ["--", sys.executable, os.path.abspath(__file__), "--worker", "--system",
                    system, "--vocab", str(a.vocab), "--tokens", str(a.tokens), "--bptt",
                    str(a.bptt), "--embed", str(a.embed), "--hidden", str(a.hidden),
                    "--sampled", str(a.sampled), "--steps", str(a.steps), "--warmup",
                    str(a.warmup)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not lines:
                sys.stderr.write(f"px-bench lm: {system} at N={n} failed ({p.returncode}):\n"
                                 f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}\n")
                continue
            r = json.loads(lines[-1][len("RESULT "):])
            r.update(nodes=n, workers_per_node=a.workers_per_node,
                     link="loopback" if a.link_gbit == "lo" else
                     ("netns-unlimited" if a.link_gbit == "0" else f"netns-{a.link_gbit}gbit"))
            results.append(r)
            sys.stderr.write(f"px-bench lm: {system} N={n}: {r['words_per_s']:.0f} words/s\n")
            if not a.json:
                print(f"{system:<10} N={n}x{a.workers_per_node}  {r['words_per_s']:9.0f} words/s"
                      f"  step {r['step_s']:.3f} s ({r['step_s_min']:.3f}-{r['step_s_max']:.3f})"
                      f"  compute {r['compute_s']:.3f} s  exposed comm "
                      f"{r['exposed_comm_s']:.3f} s", flush=True)
    if a.json:
        print(json.dumps({"scenario": "lm", "cores": os.cpu_count(),
                          "timing": "per step the slowest worker's time; median over steps",
                          "vocab": a.vocab, "tokens_per_worker": a.tokens, "embed": a.embed,
                          "hidden": a.hidden, "sampled": a.sampled, "steps": a.steps,
                          "results": results}))


if __name__ == "__main__":
    parsed = args_of(sys.argv[1:])
    worker(parsed) if parsed.worker else driver(parsed)
