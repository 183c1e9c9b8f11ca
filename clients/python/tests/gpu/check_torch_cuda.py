#!/usr/bin/env python3
"""parallax.torch on CUDA tensors, checked on one GPU against single-process references.

    PARALLAXD=.../parallaxd PARALLAX_LIB=.../libparallax.so.1 PX_CLUSTER=.../px-cluster \\
    PYTHONPATH=.../python python3 check_torch_cuda.py --out RESULT.json [--device cuda|cpu]

Plain Python (stdlib, torch and the parallax package; no NumPy, no pytest). Each check
starts its own daemons with px-cluster (loopback, one GPU shared by every worker) under its
own deadline, and every worker compares what it trained with a reference it trains itself
in one process on the whole global batch:

  ddp-1x2          DistributedDataParallel, 1 daemon x 2 workers, 20 SGD steps: every
                   parameter within 1e-5 relative (|a - b| <= 1e-6 + 1e-5 |b|) of the
                   single-process reference on the same device; the CPU reference's
                   distance is reported too; gradients are views of px_alloc_ex buckets
  ddp-2x1          the same on 2 daemons x 1 worker (the host ring across the daemons)
  optimizer-1x2    DistributedOptimizer, 1 daemon x 2 workers, 2 backward passes per step
  broadcast        broadcast_parameters and broadcast_optimizer_state (Adam: CUDA exp_avg
                   beside the host "step") from rank 0, 1 x 2
  embedding        a sparse Embedding (Adagrad, no prefetch: device pulls and pushes) with
                   indices on the device: rows come back there, gradients are pushed from
                   there; eval reads; the table after 8 steps equals torch's Adagrad on an
                   nn.Embedding, 1 x 2
  pipeline         TrainPipeline(device=...) over host batches moved to the device, a
                   prefetch Embedding (host-staged) and a Linear head under
                   DistributedOptimizer, against the reference, 1 x 2
  softmax-bag      SampledSoftmax (SGD, device steps) on device hidden states and
                   targets, 3 steps, against TF's sampled-softmax formula on a dense host
                   table; EmbeddingBag (sum) reads in eval against nn.EmbeddingBag, 1 x 2

PX_CHECK_HIDE_NUMPY=1 runs the workers as if NumPy were not installed (the torch path
needs none). --device cuda (default) needs a CUDA device: without one (or without a CUDA
torch) every check is "skipped" with the reason and the exit status is 77. --device cpu
runs the same checks on host tensors (what the tests run where there is no GPU). On a GPU
the daemons run with --gpu required. --logs DIR keeps the daemons' logs. RESULT.json:
{"checks": [{"name", "status": "passed"|"failed"|"skipped", "detail", "seconds"}],
 "torch": version, "cuda": torch's CUDA version or null, "device": name, ...}.
The whole run has --budget seconds (default 180): each check's deadline is cut to what
is left, and a check that cannot start for lack of time fails, saying so.
Exit status: 0 all passed, 77 no CUDA device (all skipped), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
CHECKS = {  # name: (nodes, workers per node, deadline in seconds)
    "ddp-1x2": (1, 2, 60),
    "ddp-2x1": (2, 1, 60),
    "optimizer-1x2": (1, 2, 60),
    "broadcast": (1, 2, 45),
    "embedding": (1, 2, 45),
    "pipeline": (1, 2, 45),
    "softmax-bag": (1, 2, 45),
}
BUDGET = 180  # seconds for the whole run: a hung check cannot take the others' time
STEPS = 20
IN, HIDDEN, OUT, BATCH = 8, 32, 4, 4
TOL_REL, TOL_ABS = 1e-5, 1e-6


# ---------------------------------------------------------------------------------------
# Workers (run under px-cluster: PARALLAX_SOCKET, PARALLAX_JOB, local rank and size set)
# ---------------------------------------------------------------------------------------
def _net(torch, device, seed=0):
    from torch import nn

    class Net(nn.Module):
        """Three Linear layers, a parameter unused at some steps (its bucket is submitted
        by synchronize) and a constant buffer (DDP broadcasts it at each forward)."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.fc1 = nn.Linear(IN, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, HIDDEN)
            self.extra = nn.Parameter(torch.randn(HIDDEN) * 0.1)
            self.fc3 = nn.Linear(HIDDEN, OUT)
            self.register_buffer("shift", torch.linspace(-0.1, 0.1, OUT))

        def forward(self, x, use_extra: bool):
            h = torch.tanh(self.fc1(x))
            if use_extra:
                h = h + self.extra
            return self.fc3(torch.tanh(self.fc2(h))) + self.shift

    return Net().to(device)


def _batch(torch, step, micro, rank, device):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.randn(BATCH, OUT, generator=g)
    return x.to(device), y.to(device)


def _global_batch(torch, step, micro, world, device):
    parts = [_batch(torch, step, micro, r, device) for r in range(world)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _reference(torch, world, device, passes=1):
    """One process, the whole global batch, the same initial weights and SGD: what every
    worker's parameters must be after STEPS steps."""
    model = _net(torch, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = _global_batch(torch, step, micro, world, device)
            (torch.nn.functional.mse_loss(model(x, step % 3 == 1), y) / passes).backward()
        opt.step()
    return model


def _distance(torch, model, ref):
    """The worst |a - b| / (TOL_ABS + TOL_REL |b|) over every parameter (<= 1 passes)."""
    worst, where = 0.0, ""
    for (n, p), r in zip(model.named_parameters(), ref.parameters()):
        a, b = p.detach().double().cpu(), r.detach().double().cpu()
        excess = ((a - b).abs() / (TOL_ABS + TOL_REL * b.abs())).max().item()
        if excess > worst:
            worst, where = excess, n
    return worst, where


def _moved(torch, model, device):
    init = _net(torch, device)
    return max((p.detach().double() - q.detach().double()).abs().max().item()
               for p, q in zip(model.parameters(), init.parameters()))


def _grads_in_buckets(model, buckets):
    spans = [(b.buffer.data_ptr(), b.buffer.data_ptr() + b.buffer.numel() *
              b.buffer.element_size(), b.buffer.device) for b in buckets]
    return all(p.grad is not None and any(
        lo <= p.grad.data_ptr() < hi and p.grad.device == dev for lo, hi, dev in spans)
        for p in model.parameters())


def worker_train(torch, pxt, px, device, mode):
    w = px.world
    model = _net(torch, device)
    passes = 2 if mode == "optimizer" else 1
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if mode == "ddp":
        wrapped = pxt.DistributedDataParallel(model, client=px, bucket_cap_mb=0.004,
                                              first_bucket_mb=0.001)
        forward, buckets = wrapped, wrapped.buckets
    else:
        opt = pxt.DistributedOptimizer(opt, model.named_parameters(), client=px,
                                       bucket_cap_mb=0.004, first_bucket_mb=0.001,
                                       backward_passes_per_step=passes)
        forward, buckets = model, opt.buckets
    views = True
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = _batch(torch, step, micro, w.rank, device)
            loss = torch.nn.functional.mse_loss(forward(x, step % 3 == 1), y) / passes
            loss.backward()
        views = views and _grads_in_buckets(model, buckets)
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    worst, where = _distance(torch, model, _reference(torch, w.world_size, device, passes))
    cpu_worst, _ = _distance(torch, model, _reference(torch, w.world_size,
                                                      torch.device("cpu"), passes))
    moved = _moved(torch, model, device)
    devices = sorted({str(b.buffer.device) for b in buckets})
    ok = worst <= 1 and moved > 0.01 and views and devices == [str(device)]
    return {"ok": ok, "worst_over_tolerance": worst, "worst_param": where,
            "cpu_reference_over_tolerance": cpu_worst, "moved": moved,
            "grads_are_bucket_views": views, "buckets": len(buckets),
            "bucket_devices": devices}


def worker_broadcast(torch, pxt, px, device):
    rank = px.rank
    model = _net(torch, device, seed=rank)  # every rank its own weights
    root_model = _net(torch, device, seed=0)  # what rank 0 holds
    differed = any(not torch.equal(p, q) for p, q in zip(model.parameters(),
                                                         root_model.parameters()))
    pxt.broadcast_parameters(model.state_dict(), root_rank=0, client=px)
    params_equal = all(torch.equal(p, q) for p, q in zip(model.state_dict().values(),
                                                           root_model.state_dict().values()))

    def adam_after_a_step(m, seed):
        opt = torch.optim.Adam(m.parameters(), lr=0.01 * (seed + 1))
        x, y = _batch(torch, 0, 0, seed, device)
        torch.nn.functional.mse_loss(m(x, True), y).backward()
        opt.step()
        return opt

    opt = adam_after_a_step(model, rank)
    root_opt = adam_after_a_step(_net(torch, device, seed=0), 0)  # model: rank 0's weights
    # (model already holds rank 0's weights, so rank 0's state is reproducible here)
    pxt.broadcast_optimizer_state(opt, root_rank=0, client=px)
    state_equal, devices = True, set()
    for p, q in zip(model.parameters(), root_opt.param_groups[0]["params"]):
        s, t = opt.state[p], root_opt.state[q]
        for key in t:
            a, b = s[key], t[key]
            if isinstance(b, torch.Tensor):
                devices.add(f"{key}:{a.device.type}")
                state_equal = state_equal and torch.allclose(a.double().cpu(),
                                                             b.double().cpu(), rtol=1e-5,
                                                             atol=1e-12)
            else:
                state_equal = state_equal and a == b
    lr_equal = opt.param_groups[0]["lr"] == root_opt.param_groups[0]["lr"]
    ok = (differed or rank == 0) and params_equal and state_equal and lr_equal
    return {"ok": ok, "differed_before": differed, "params_equal": params_equal,
            "optimizer_state_equal": state_equal, "lr_equal": lr_equal,
            "state_devices": sorted(devices)}


ROWS, DIM, PER_WORKER, EMB_STEPS = 50, 6, 8, 8


def _emb_batches(torch, world):
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, ROWS, (world * PER_WORKER,), generator=g)
            for _ in range(EMB_STEPS)]


def _rel_err(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs() / b.abs().clamp_min(1e-3)).max().item()


def worker_embedding(torch, pxt, px, device):
    from torch import nn
    rank, world = px.rank, px.world_size
    torch.manual_seed(0)
    w0 = torch.randn(ROWS, DIM)
    emb = pxt.Embedding(ROWS, DIM, name="check.emb", client=px, optimizer="adagrad",
                        lr=0.3, initial_accumulator=0.1, epsilon=1e-10)
    emb.load_state_dict({"weight": w0.to(device)})  # a checkpoint mapped to the device
    ref = nn.Embedding(ROWS, DIM)
    ref.weight.data.copy_(w0)
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.3, initial_accumulator_value=0.1,
                              eps=1e-10)
    target = torch.linspace(-1, 1, DIM)
    rows_on_device = True
    for batch in _emb_batches(torch, world):
        mine = batch[rank * PER_WORKER:(rank + 1) * PER_WORKER].reshape(2, -1).to(device)
        out = emb(mine)
        rows_on_device = rows_on_device and out.device == device
        ((out - target.to(device)) ** 2).mean().backward()
        opt.zero_grad()
        ((ref(batch) - target) ** 2).mean().backward()
        opt.step()
    emb.synchronize()
    px.barrier(30)
    emb.eval()
    with torch.no_grad():  # a read on the device, not a step
        idx = torch.arange(ROWS, device=device)
        read = emb(idx)
    emb.train()
    read_err = _rel_err(read, ref.weight)
    err = _rel_err(emb.state_dict()["weight"], ref.weight)
    ok = err < TOL_REL and read_err < TOL_REL and rows_on_device and read.device == device
    return {"ok": ok, "max_rel_err": err, "read_rel_err": read_err,
            "rows_on_device": rows_on_device, "read_device": str(read.device)}


def worker_pipeline(torch, pxt, px, device):
    from torch import nn
    rank, world = px.rank, px.world_size
    torch.manual_seed(0)
    w0 = torch.randn(ROWS, DIM)

    class Model(nn.Module):
        def __init__(self, emb):
            super().__init__()
            torch.manual_seed(1)
            self.emb = emb
            self.head = nn.Linear(DIM, 1)

        def forward(self, batch):
            idx, y = batch
            return ((self.head(self.emb(idx)).squeeze(-1) - y) ** 2).mean()

        def prefetch(self, batch):
            self.emb.prefetch(batch[0])

    emb = pxt.Embedding(ROWS, DIM, name="check.pipe", client=px, optimizer="sgd", lr=0.2,
                        prefetch=True)
    emb.load_state_dict({"weight": w0})
    model = Model(emb)
    model.head.to(device)
    opt = pxt.DistributedOptimizer(torch.optim.SGD(model.head.parameters(), lr=0.2),
                                   model.head.named_parameters(), client=px)
    ref_emb = nn.Embedding(ROWS, DIM)
    ref_emb.weight.data.copy_(w0)
    ref = Model(ref_emb)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    batches = _emb_batches(torch, world)
    g = torch.Generator().manual_seed(99)
    ys = [torch.randn(world * PER_WORKER, generator=g) for _ in batches]
    mine = [(b[rank * PER_WORKER:(rank + 1) * PER_WORKER],
             y[rank * PER_WORKER:(rank + 1) * PER_WORKER]) for b, y in zip(batches, ys)]
    pipeline = pxt.TrainPipeline(model, [opt], device=device)
    it = iter(mine)
    losses_on_device = True
    for batch, y in zip(batches, ys):
        loss = pipeline.progress(it)
        losses_on_device = losses_on_device and loss.device == device
        ref_opt.zero_grad()
        ref((batch, y)).backward()
        ref_opt.step()
    try:
        pipeline.progress(it)
        ended = False
    except StopIteration:
        ended = True
    emb.synchronize()
    px.barrier(30)
    table_err = _rel_err(emb.state_dict()["weight"], ref_emb.weight)
    head_err = max(_rel_err(p, q) for p, q in zip(model.head.parameters(),
                                                  ref.head.parameters()))
    ok = (table_err < TOL_REL and head_err < TOL_REL and losses_on_device and ended
          and pipeline.steps == len(batches))
    return {"ok": ok, "table_rel_err": table_err, "head_rel_err": head_err,
            "losses_on_device": losses_on_device, "served_ahead":
            emb.variable.stats().rows_served_ahead}


def worker_softmax_bag(torch, pxt, px, device):
    from torch import nn
    classes, dim, num_sampled = 40, 5, 12
    torch.manual_seed(2)
    w0 = torch.randn(classes, dim + 1) * 0.3
    layer = pxt.SampledSoftmax(classes, dim, num_sampled, name="check.softmax", client=px,
                               optimizer="sgd", lr=0.5, sampler_seed=9)
    layer.load_state_dict({"weight": w0})
    ref_w = w0.clone().requires_grad_(True)
    sampler = pxt.LogUniformSampler(classes, 9)
    rank, world = px.rank, px.world_size
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(world * 4, dim, generator=g),
             torch.randint(0, classes, (world * 4,), generator=g)) for _ in range(3)]
    mine = slice(rank * 4, (rank + 1) * 4)
    loss_err, loss_on_device = 0.0, True
    for step, (hidden, targets) in enumerate(data):
        loss = layer(hidden[mine].to(device), targets[mine].to(device))
        loss_on_device = loss_on_device and loss.device == device
        loss.backward()
        sample = sampler.sample(num_sampled, step)
        ref_loss = pxt.sampled_softmax_loss(hidden, targets, sample, ref_w[targets],
                                            ref_w[sample], sampler)
        ref_loss.backward()
        with torch.no_grad():
            ref_w -= 0.5 * ref_w.grad
            ref_w.grad = None
        if step == 0:  # this worker's first loss, from the initial table
            first = pxt.sampled_softmax_loss(hidden[mine], targets[mine], sample,
                                             w0[targets[mine]], w0[sample], sampler).item()
            loss_err = abs(loss.item() - first) / max(1e-6, abs(first))
    layer.synchronize()
    px.barrier(30)
    table_err = _rel_err(layer.state_dict()["weight"], ref_w)
    hidden = data[0][0][:3]
    with torch.no_grad():
        log_probs = layer.full_log_probs(hidden.to(device))
        want = torch.log_softmax(hidden @ ref_w[:, :-1].t() + ref_w[:, -1], dim=-1)
    table_err = max(table_err, _rel_err(log_probs, want))

    torch.manual_seed(1)
    b0 = torch.randn(ROWS, DIM)
    bag = pxt.EmbeddingBag(ROWS, DIM, mode="sum", name="check.bag", client=px)
    bag.load_state_dict({"weight": b0})
    ref_bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")
    ref_bag.weight.data.copy_(b0)
    idx, offsets = torch.tensor([3, 7, 7, 49, 0]), torch.tensor([0, 2])
    bag.eval()
    with torch.no_grad():
        got = bag(idx.to(device), offsets.to(device))
    bag_err = _rel_err(got, ref_bag(idx, offsets))
    ok = (table_err < TOL_REL and loss_err < TOL_REL and bag_err < TOL_REL and loss_on_device
          and got.device == device and bag.variable.stats().pull_steps == 0)
    return {"ok": ok, "table_rel_err": table_err, "first_loss_rel_err": loss_err,
            "bag_rel_err": bag_err, "loss_on_device": loss_on_device,
            "bag_device": str(got.device)}


def run_worker(name: str, device_name: str, result_dir: str) -> int:
    if os.environ.get("PX_CHECK_HIDE_NUMPY") == "1":  # as where NumPy is not installed
        sys.modules["numpy"] = None
    import torch
    torch.set_num_threads(1)
    try:  # the references compare float32 arithmetic: no TF32 (torch's default, made sure)
        torch.backends.cuda.matmul.allow_tf32 = False
    except Exception:  # noqa: BLE001 - a torch whose API moved: its default is kept
        pass
    import parallax
    import parallax.torch as pxt
    result = {"ok": False}
    px = None
    try:
        px = parallax.Client(timeout=60, op_timeout=60)
        device = torch.device(device_name)
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device)
        if name in ("ddp-1x2", "ddp-2x1"):
            result = worker_train(torch, pxt, px, device, "ddp")
        elif name == "optimizer-1x2":
            result = worker_train(torch, pxt, px, device, "optimizer")
        elif name == "broadcast":
            result = worker_broadcast(torch, pxt, px, device)
        elif name == "embedding":
            result = worker_embedding(torch, pxt, px, device)
        elif name == "pipeline":
            result = worker_pipeline(torch, pxt, px, device)
        elif name == "softmax-bag":
            result = worker_softmax_bag(torch, pxt, px, device)
        else:
            raise ValueError(f"unknown check {name}")
    except Exception as e:  # noqa: BLE001 - reported in the result
        result = {"ok": False, "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()[-3000:]}
    rank = px.rank if px is not None else int(os.environ.get("PX_CLUSTER_NODE", "0")) * 100 \
        + int(os.environ.get("PARALLAX_LOCAL_RANK", "0"))
    result["rank"] = rank
    result["numpy_loaded"] = sys.modules.get("numpy") is not None
    with open(os.path.join(result_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    if px is not None:
        px.close()
    return 0 if result["ok"] else 1


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------
def _describe_torch():
    """(torch module or None, facts for RESULT.json, why CUDA cannot run or None)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return None, {"torch": None, "cuda": None}, f"torch does not import: {e}"
    facts = {"torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
             "python": sys.version.split()[0],
             "numpy": getattr(sys.modules.get("numpy"), "__version__", None)}
    if not facts["cuda"]:
        return torch, facts, f"torch {torch.__version__} is built without CUDA"
    try:
        count = torch.cuda.device_count()
        available = torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        return torch, facts, f"no CUDA device: {e}"
    if not available or count == 0:
        return torch, facts, "no CUDA device (torch.cuda.is_available() is False)"
    facts["device"] = torch.cuda.get_device_name(0)
    facts["device_count"] = count
    return torch, facts, None


def _run_check(name: str, device: str, logs: str, deadline: int) -> dict:
    nodes, per_node, _ = CHECKS[name]
    result_dir = tempfile.mkdtemp(prefix=f"pxcheck-{name}-")
    log_dir = os.path.join(logs, name)
    os.makedirs(log_dir, exist_ok=True)
    cmd = [os.environ["PX_CLUSTER"], "--nodes", str(nodes), "--workers-per-node",
           str(per_node), "--daemon", os.environ["PARALLAXD"], "--timeout", str(deadline),
           "--job", f"check-{name}-{uuid.uuid4().hex[:6]}", "--logs", log_dir,
           # On a GPU the daemons must have loaded their GPU backend: else they say why
           # at start (px-cluster prints their log) instead of each device step failing.
           *(["--daemon-arg", "--gpu", "--daemon-arg", "required"] if device == "cuda"
             else []), "--",
           sys.executable, os.path.abspath(__file__), "--worker", name, "--device", device,
           "--result-dir", result_dir]
    env = dict(os.environ)
    package = os.path.dirname(os.path.dirname(HERE))  # clients/python in a checkout
    if os.path.isdir(os.path.join(package, "parallax")):
        env["PYTHONPATH"] = env.get("PYTHONPATH", "") + os.pathsep + package
    env.setdefault("OMP_NUM_THREADS", "1")
    # Its own session: if px-cluster itself hangs, its daemons and workers go with it.
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=deadline + 15)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc, out = None, f"px-cluster did not end {deadline + 15} s after it started " \
                        f"(killed with its daemons and workers); its output:\n{out}"
    workers = []
    try:
        for f in sorted(os.listdir(result_dir)):
            with open(os.path.join(result_dir, f)) as fh:
                workers.append(json.load(fh))
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    workers.sort(key=lambda r: r.get("rank", 0))
    passed = rc == 0 and len(workers) == nodes * per_node and all(w["ok"] for w in workers)
    detail = {"nodes": nodes, "workers_per_node": per_node, "deadline_s": deadline,
              "px_cluster_status": rc, "workers": workers}
    if not passed:
        detail["output"] = out[-4000:]
        detail["logs"] = log_dir
    return {"name": name, "status": "passed" if passed else "failed", "detail": detail}


def main(argv=None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--out", help="where RESULT.json goes (default: stdout only)")
    a.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default) or cpu: the same checks on host tensors")
    a.add_argument("--only", action="append", choices=sorted(CHECKS),
                   help="run only these checks (repeatable)")
    a.add_argument("--logs", help="daemon logs, a folder per check (default: a temporary "
                   "folder; named in a failed check's detail)")
    a.add_argument("--budget", type=int, default=BUDGET,
                   help=f"seconds for the whole run (default {BUDGET}): each check's "
                   "deadline is cut to what is left, and a check that cannot start fails")
    a.add_argument("--worker", help=argparse.SUPPRESS)
    a.add_argument("--result-dir", help=argparse.SUPPRESS)
    args = a.parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.device, args.result_dir)

    names = args.only or list(CHECKS)
    torch, facts, why_not = _describe_torch()
    if args.device == "cpu":
        why_not = None if torch is not None else why_not
    summary = dict(facts, mode=args.device, checks=[])
    if why_not is None:
        missing = [v for v in ("PARALLAXD", "PX_CLUSTER") if not os.environ.get(v)]
        if missing:
            why_not = "set " + " and ".join(missing)
            status = "failed"
        else:
            status = None
    else:
        status = "skipped"
    # Daemon logs only when checks run (kept below if one fails: its detail names them).
    logs = args.logs or (tempfile.mkdtemp(prefix="pxcheck-logs-") if status is None else "")
    began = time.monotonic()
    for name in names:
        start = time.monotonic()
        left = int(args.budget - (start - began)) - 15  # px-cluster's own teardown
        if status is not None:
            entry = {"name": name, "status": status, "detail": why_not}
        elif left < 20:
            entry = {"name": name, "status": "failed",
                     "detail": f"not run: the run's budget of {args.budget} s is spent"}
        else:
            try:
                entry = _run_check(name, args.device, logs, min(CHECKS[name][2], left))
            except Exception as e:  # noqa: BLE001
                entry = {"name": name, "status": "failed",
                         "detail": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        entry["seconds"] = round(time.monotonic() - start, 2)
        summary["checks"].append(entry)
        print(f"check_torch_cuda: {name}: {entry['status']} ({entry['seconds']} s)"
              + (f": {why_not}" if status else ""), file=sys.stderr, flush=True)
    text = json.dumps(summary, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    statuses = {c["status"] for c in summary["checks"]}
    if logs and not args.logs and "failed" not in statuses:  # nothing names them
        shutil.rmtree(logs, ignore_errors=True)
    if statuses == {"passed"}:
        return 0
    if statuses == {"skipped"}:
        return SKIP
    return 1


if __name__ == "__main__":
    sys.exit(main())
