#!/usr/bin/env python3
"""Trains the word-level language model on the King James Bible through Parallax.

Run one process per worker under a launcher that sets PARALLAX_* (tools/px-cluster),
torchrun (LOCAL_RANK/LOCAL_WORLD_SIZE) or srun; `tools/quickstart demo` runs it on
2 nodes x 2 workers. --reference trains the same model in this one process with plain
PyTorch on the whole global batch instead (the equivalence test's baseline).

Prints, from global rank 0: per step the global batch's mean loss and words/s; at the end
the held-out perplexity (exact softmax over the whole vocabulary) and each Parallax
variable's route, density alpha and bytes, per node. --json FILE writes the losses too.
--elastic trains under parallax.elastic (docs/elastic.md): a lost or added node resets the
run, which resumes from the last committed step in the new world (tools/bench/elastic_lm.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import numpy as np
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
try:
    import parallax  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a source checkout: the package next door
    sys.path.insert(0, os.path.join(_HERE, "..", "..", "clients", "python"))
import corpus as corpus_mod  # noqa: E402
from model import LMConfig, ParallaxLM, ReferenceLM, consistency_options  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16, help="sequences per worker per step")
    p.add_argument("--bptt", type=int, default=20, help="tokens per sequence")
    p.add_argument("--embed", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--sampled", type=int, default=256, help="sampled-softmax negatives")
    p.add_argument("--route", default="hybrid", help="sparse route of both tables")
    p.add_argument("--wire-dtype", default="f32", choices=("f32", "bf16", "f16"),
                   help="both tables' rows and gradients between nodes (16 bits: lossy)")
    p.add_argument("--compression", default="none", choices=("none", "bf16", "fp16"),
                   help="the dense buckets' sums between nodes (parallax.torch.Compression; "
                        "16 bits: lossy)")
    p.add_argument("--consistency", default="sync", choices=("sync", "bounded", "async"),
                   help="both tables' consistency")
    p.add_argument("--staleness", type=int, default=0, help="bounded: pull steps a pull may lag")
    p.add_argument("--row-cache", type=int, default=0, metavar="ROWS",
                   help="a hot-row cache of ROWS rows per node and table (bounded tables)")
    p.add_argument("--row-cache-staleness", type=int, default=0, metavar="STEPS",
                   help="pull steps a cached copy serves (and gradients are held)")
    p.add_argument("--replicas", type=int, default=1, choices=(1, 2),
                   help="2: the daemons keep a copy of each node's partitions of both tables, "
                        "handed to the next run when a node is lost (needs membership on etcd)")
    p.add_argument("--prefetch", action="store_true",
                   help="pull each step's rows during the previous step's backward "
                        "(px_prefetch_rows; the same result)")
    p.add_argument("--eval-tokens", type=int, default=8192, help="held-out tokens scored")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--pause-after-train", type=float, default=0.0, metavar="SECONDS",
                   help="after the last step, meet at a barrier, print 'paused after "
                        "training' (rank 0) and wait SECONDS before the evaluation: a "
                        "window to sample the processes (tools/bench/soak.py)")
    p.add_argument("--parallelize", action="store_true",
                   help="train ReferenceLM, the plain-PyTorch model, as it is: "
                        "parallax.torch.parallelize() makes its tables daemon-held")
    p.add_argument("--reference", type=int, default=0, metavar="WORKERS",
                   help="train in this process on the global batch of WORKERS workers")
    p.add_argument("--json", default="", help="write per-step losses and final state here")
    p.add_argument("--elastic", action="store_true",
                   help="train under parallax.elastic: survive lost and added nodes (the "
                        "sparse tables come back from the daemons' periodic checkpoints)")
    p.add_argument("--global-batch", type=int, default=0, metavar="SEQUENCES",
                   help="--elastic: sequences per step over the whole world, split evenly "
                        "(it must divide by every world size the job runs at): step s then "
                        "trains on the same data at every world size. Default: --batch per "
                        "worker")
    p.add_argument("--step-log", default="", metavar="FILE",
                   help="--elastic: append each committed step's wall time, world size and "
                        "resets to FILE (one JSON line each)")
    # Tokenised once per machine; bump the suffix when corpus.py changes what it makes.
    p.add_argument("--cache", default="/tmp/parallax-kjv-corpus-v1.pt")
    args = p.parse_args()
    if args.global_batch < 0:
        p.error(f"--global-batch: {args.global_batch} is not a number of sequences (0 or more)")
    for flag, value in (("--global-batch", args.global_batch), ("--step-log", args.step_log),
                        ("--replicas", args.replicas > 1)):
        if value and not args.elastic:
            p.error(f"{flag} applies to --elastic runs only")
    return args


def batches(ids: torch.Tensor, rows: int, bptt: int, first_row: int, count: int):
    """Step t's inputs and targets: rows first_row..first_row+count of the global streams."""
    streams = corpus_mod.streams(ids, rows)
    t = 0
    while True:
        if t + bptt + 1 > streams.shape[1]:
            t = 0
        chunk = streams[first_row:first_row + count, t:t + bptt + 1]
        yield chunk[:, :-1], chunk[:, 1:]
        t += bptt


def _reference_pair(cfg):
    model = ReferenceLM(cfg)
    return model, model.optimizers()


def run_reference(args, cfg, corpus) -> None:
    model, optimizers = _reference_pair(cfg)
    data = batches(corpus.train, args.reference * args.batch, args.bptt, 0,
                   args.reference * args.batch)
    losses = []
    for step in range(args.steps):
        x, y = next(data)
        for o in optimizers:
            o.zero_grad()
        loss = model(x, y)
        loss.backward()
        for o in optimizers:
            o.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"reference step {step:4d}  loss {losses[-1]:.5f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"losses": losses,
                       "embedding_sum": model.embedding.weight.double().sum().item(),
                       "softmax_sum": model.softmax_table.weight.double().sum().item(),
                       "body_sum": sum(p.double().sum().item()
                                       for p in model.body.parameters())}, f)


def route_report(client, tables, buckets) -> list:
    lines = []
    for var, kind in ((t.variable, "sparse") for t in tables):
        s = var.stats()
        alpha = s.rows_pulled / max(1, s.pull_steps * client.world.local_size * var.rows)
        route = ["hybrid", "ps", "allgatherv", "allreduce"][var.options.route]
        lines.append(f"  node {client.world.node_index}  {var.name:<14} {kind:<6} "
                     f"route {route:<10} alpha {alpha:.4f}  rows {var.rows}x{var.dim}  "
                     f"sent {s.bytes_sent / 2**20:8.2f} MiB  received "
                     f"{s.bytes_received / 2**20:8.2f} MiB"
                     + (f"  cache hits {s.cache_hits} misses {s.cache_misses} "
                        f"saved {s.cache_bytes_saved / 2**20:.2f} MiB" if var.options.cache_rows
                        else ""))
    for bucket in buckets:
        var = bucket.variable
        s = var.stats()
        lines.append(f"  node {client.world.node_index}  {var.name:<14} dense  "
                     f"route allreduce  {var.count} values  reduced {s.bytes / 2**20:8.2f} MiB "
                     f"in {s.ops} steps")
    return lines


def run_parallax(args, cfg, corpus) -> None:
    import parallax
    import parallax.torch as pxt
    client = parallax.Client(timeout=120, op_timeout=300)
    pxt.set_default_client(client)
    world = client.world
    if args.parallelize:
        # The single-process model and optimizers, unchanged: parallelize() finds the two
        # nn.Embedding tables (the output one looked up twice a step) and Adagrad for them.
        options = dict(route=cfg.route, wire_dtype=cfg.wire_dtype, **consistency_options(cfg))
        model, optimizers = pxt.parallelize(*_reference_pair(cfg), client=client, name="lm",
                                            tables={"embedding": options,
                                                    "softmax_table": options},
                                            compression=args.compression)
        plan = pxt.plan(model)
        tables = [plan.tables["embedding"], plan.tables["softmax_table"]]
        buckets = plan.buckets
    else:
        model = ParallaxLM(cfg, client)
        model.body = pxt.DistributedDataParallel(model.body, client=client, name="lm.body",
                                                 compression=args.compression)
        optimizers = [torch.optim.Adam(model.body.parameters(), lr=cfg.dense_lr)]
        tables, buckets = [model.embedding, model.softmax], model.body.buckets
    data = batches(corpus.train, world.world_size * args.batch, args.bptt,
                   world.rank * args.batch, args.batch)
    loss_var = client.dense("lm.loss", 1, np.float64, op="mean")
    lead = world.rank == 0
    if lead:
        print(f"parallax: {world.node_count} nodes x {world.local_size} workers, vocabulary "
              f"{cfg.vocab}, {world.world_size * args.batch * args.bptt} tokens per step "
              f"(KJV Bible, {len(corpus.train)} training tokens)", flush=True)
    losses = []
    words_per_step = world.world_size * args.batch * args.bptt
    client.barrier()
    t_start = time.monotonic()
    data = itertools.islice(data, args.steps)
    # --prefetch: TrainPipeline takes each next batch ahead and pulls its rows of both
    # tables while this step's backward runs.
    pipeline = pxt.TrainPipeline(model, optimizers, forward=lambda m, batch: m(*batch),
                                 prefetch=lambda batch: model.prefetch(*batch))
    for step in range(args.steps):
        t0 = time.monotonic()
        if args.prefetch:
            loss = pipeline.progress(data)
        else:
            x, y = next(data)
            for o in optimizers:
                o.zero_grad()
            loss = model(x, y)
            loss.backward()
            for o in optimizers:
                o.step()
        mean = np.array([loss.item()])
        loss_var.allreduce(mean).wait()
        losses.append(float(mean[0]))
        dt = time.monotonic() - t0
        if lead and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}  words/s {words_per_step / dt:8.0f}",
                  flush=True)
    train_s = time.monotonic() - t_start
    if args.pause_after_train > 0:
        client.barrier()
        if lead:
            print(f"paused after training: {args.steps} steps in {train_s:.1f} s, "
                  f"waiting {args.pause_after_train:g} s", flush=True)
        time.sleep(args.pause_after_train)

    softmax = tables[1].state_dict()["weight"]
    perplexity = held_out_perplexity(args, corpus, model, softmax, client)
    report = route_report(client, tables, buckets)
    client.barrier()
    if lead:
        print(f"trained {args.steps} steps in {train_s:.1f} s: "
              f"{args.steps * words_per_step / train_s:.0f} words/s overall")
        print(f"held-out perplexity {perplexity:.1f} over "
              f"{args.eval_tokens // world.world_size * world.world_size} tokens "
              f"(a uniform guess: {cfg.vocab})")
    # One report per node, in node order.
    for node in range(world.node_count):
        if world.node_index == node and world.local_rank == 0:
            if node == 0:
                print("variables (per node):")
            print("\n".join(report), flush=True)
        client.barrier()
    if args.json and lead:
        with open(args.json, "w") as f:
            json.dump({"losses": losses,
                       "perplexity": perplexity,
                       "train_s": train_s, "wire_dtype": args.wire_dtype,
                       "embedding_sum": tables[0].state_dict()["weight"].double().sum().item(),
                       "softmax_sum": softmax.double().sum().item(),
                       "body_sum": sum(p.double().sum().item()
                                       for p in model.body.parameters())}, f)
    client.barrier()
    client.close()


def batch_at(streams: torch.Tensor, step: int, bptt: int, first_row: int, count: int):
    """Step `step`'s inputs and targets, as batches() yields them (the streams wrap)."""
    positions = (streams.shape[1] - bptt - 1) // bptt + 1
    t = (step % positions) * bptt
    chunk = streams[first_row:first_row + count, t:t + bptt + 1]
    return chunk[:, :-1], chunk[:, 1:]


def held_out_perplexity(args, corpus, model, softmax, client) -> float:
    """Each worker scores its share of the held-out tokens with the exact softmax."""
    world = client.world
    model.eval()
    per_worker = args.eval_tokens // world.world_size
    valid = corpus.valid[world.rank * per_worker:(world.rank + 1) * per_worker + 1]
    nll = np.zeros(2)
    with torch.no_grad():
        for start in range(0, len(valid) - 1, 512):
            y = valid[start + 1:start + 513]
            x = valid[start:start + 512][:len(y)]
            logp = model.log_probs(x[None, :], softmax)
            nll[0] += -logp.gather(1, y[:, None]).sum().item()
            nll[1] += len(y)
    client.dense("lm.eval", 2, np.float64).allreduce(nll).wait()
    return math.exp(nll[0] / nll[1])


def run_elastic(args, cfg, corpus) -> None:
    """ParallaxLM under parallax.elastic: the State holds the step, the dense body and its
    optimizer, and the losses; the tables live in the daemons (their checkpoints)."""
    import parallax.elastic as elastic
    import parallax.torch as pxt
    state = elastic.State(step=0, body=None, optimizer=None, losses=[], worlds=[])
    step_log = open(args.step_log, "a", buffering=1) if args.step_log else None

    @elastic.run(reset_timeout=300.0, timeout=120, op_timeout=120)
    def train(client, state):
        world = client.world
        # The tables' initial values are loaded once; after a reset they come back from the
        # daemons' newest periodic checkpoint.
        model = ParallaxLM(cfg, client, load_initial=state.step == 0)
        if state.body is not None:
            model.body.load_state_dict(state.body)
        body = model.body
        model.body = pxt.DistributedDataParallel(body, client=client, name="lm.body")
        optimizer = torch.optim.Adam(model.body.parameters(), lr=cfg.dense_lr)
        if state.optimizer is not None:
            optimizer.load_state_dict(state.optimizer)
        # A smaller world trains on fewer sequences a step, unless the global batch is fixed
        # (as a Horovod elastic user scales the per-worker batch on a reset).
        rows = args.global_batch or world.world_size * args.batch
        if rows % world.world_size:
            raise SystemExit(f"train.py: --global-batch {rows} does not divide by the world "
                             f"size {world.world_size}")
        per_worker = rows // world.world_size
        streams = corpus_mod.streams(corpus.train, rows)
        loss_var = client.dense("lm.loss", 1, np.float64, op="mean")
        state.worlds = state.worlds + [world.world_size]
        while state.step < args.steps:
            x, y = batch_at(streams, state.step, args.bptt, world.rank * per_worker, per_worker)
            optimizer.zero_grad()
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            mean = np.array([loss.item()])
            loss_var.allreduce(mean).wait()
            state.step += 1
            state.losses = state.losses + [float(mean[0])]
            state.body = body.state_dict()
            state.optimizer = optimizer.state_dict()
            state.commit()
            if step_log:
                step_log.write(json.dumps({"t": time.time(), "step": state.step,
                                           "world": world.world_size,
                                           "resets": state.resets}) + "\n")
            if world.rank == 0 and state.step % args.log_every == 0:
                print(f"step {state.step:4d}  loss {state.losses[-1]:.4f}  world "
                      f"{world.world_size}  resets {state.resets}", flush=True)
        perplexity = held_out_perplexity(args, corpus, model,
                                         model.softmax.state_dict()["weight"], client)
        restored = [t.variable.stats().restored_steps for t in (model.embedding, model.softmax)]
        client.barrier()
        return perplexity, world.rank, restored

    t0 = time.monotonic()
    perplexity, rank, restored = train(state)
    if rank == 0:
        print(f"held-out perplexity {perplexity:.2f} after {args.steps} steps, "
              f"{state.resets} resets, worlds {state.worlds}", flush=True)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"perplexity": perplexity, "steps": args.steps, "resets": state.resets,
                       "worlds": state.worlds, "losses": state.losses,
                       "tables_restored_at": restored, "seconds": time.monotonic() - t0}, f)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # several workers share this machine's cores
    corpus = corpus_mod.load(cache=args.cache)
    cfg = LMConfig(vocab=corpus.vocab_size, embed=args.embed, hidden=args.hidden,
                   num_sampled=args.sampled, route=args.route, wire_dtype=args.wire_dtype,
                   prefetch=args.prefetch, consistency=args.consistency,
                   staleness=args.staleness, cache_rows=args.row_cache,
                   cache_staleness=args.row_cache_staleness, replicas=args.replicas)
    if args.parallelize and args.prefetch:
        sys.exit("train.py: --prefetch needs ParallaxLM's prefetch(), not --parallelize")
    if args.reference:
        run_reference(args, cfg, corpus)
    elif args.elastic:
        run_elastic(args, cfg, corpus)
    else:
        run_parallax(args, cfg, corpus)


if __name__ == "__main__":
    main()
