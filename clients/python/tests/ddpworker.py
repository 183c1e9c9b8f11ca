"""A worker process of the parallax.torch dense tests: `ddpworker.py SCENARIO [ARGS]`.

Runs a scenario against the daemon named by the environment (real daemons, no mocks) and
prints one JSON line (also $PXPY_RESULT_DIR/<rank>.json under px-cluster). Each worker
also trains a single-process reference on the whole global batch (cheap, same seed), so
it can compare its own parameters against it; the tests check what is compared across
workers.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Tuple

import torch
from torch import nn

import parallax
import parallax.torch as pxt
from pyworker import emit

torch.set_num_threads(1)
IN, OUT, BATCH = 8, 4, 4  # BATCH rows per worker per microbatch


class Net(nn.Module):
    """A few Linear layers, a parameter (extra) unused in some steps or on some workers,
    and a float64 parameter (scale): its gradients go to a bucket of their own dtype."""

    def __init__(self, hidden: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(IN, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.extra = nn.Parameter(torch.randn(hidden) * 0.1)
        self.fc3 = nn.Linear(hidden, OUT)
        self.scale = nn.Parameter(torch.ones(OUT, dtype=torch.float64))

    def forward(self, x: torch.Tensor, use_extra: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if bool(use_extra.any()):  # a Python branch: where no row uses it, extra is unused
            h = h + use_extra[:, None] * self.extra
        h = torch.tanh(self.fc2(h))
        return self.fc3(h) * self.scale.float()


def uses_extra(step: int, rank: int) -> bool:
    # step % 3 == 0: no worker uses extra; 1: all do; 2: even ranks only.
    return step % 3 == 1 or (step % 3 == 2 and rank % 2 == 0)


def batch(step: int, micro: int, rank: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Worker rank's rows of the global batch of (step, microbatch)."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.randn(BATCH, OUT, generator=g)
    flag = torch.full((BATCH,), 1.0 if uses_extra(step, rank) else 0.0)
    return x, y, flag


def global_batch(step: int, micro: int, world: int):
    parts = [batch(step, micro, r) for r in range(world)]
    return tuple(torch.cat([p[i] for p in parts]) for i in range(3))


def loss_of(model: nn.Module, x, y, flag) -> torch.Tensor:
    return nn.functional.mse_loss(model(x, flag), y)


def reference(world: int, steps: int, micros: int) -> Net:
    """Single process, the global batch of every worker, the same initial weights, up to the
    last step's gradients (no step() after them). The mean loss over the global batch is
    the mean of the workers' mean losses (equal batch sizes), so its gradients are what the
    wrapper's averaged gradients must be."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        for micro in range(micros):
            (loss_of(model, *global_batch(step, micro, world)) / micros).backward()
        if step < steps - 1:
            opt.step()
    return model


def compare(model: nn.Module, ref: nn.Module) -> dict:
    """Largest difference to the reference (parameters and last gradients), as a multiple
    of the tolerance, and how far training moved the weights."""
    worst, moved, names = 0.0, 0.0, []
    init = Net()
    for (n, p), r, p0 in zip(model.named_parameters(), ref.parameters(), init.parameters()):
        for a, b in ((p.detach(), r.detach()), (p.grad, r.grad)):
            tol = 1e-6 + 1e-5 * b.abs()
            excess = ((a.double() - b.double()).abs() / tol.double()).max().item()
            if excess > 1:
                names.append(n)
            worst = max(worst, excess)
        moved = max(moved, (p.detach().double() - p0.detach().double()).abs().max().item())
    return {"worst_over_tolerance": worst, "moved": moved, "off": names}


def compressed(model: nn.Module, ref: nn.Module, wire: torch.dtype) -> dict:
    """What a 16-bit wire must give: every float32 gradient a wire value (the mean over a
    power-of-two world divides a wire value exactly), their bits (to compare across
    workers), and the largest relative norm error of a float32 gradient or parameter
    against the f32 reference."""
    grads = [p.grad for p in model.parameters() if p.dtype == torch.float32]
    worst = 0.0
    for p, r in zip(model.parameters(), ref.parameters()):
        if p.dtype == torch.float32:
            for a, b in ((p.detach(), r.detach()), (p.grad, r.grad)):
                worst = max(worst, ((a.double() - b.double()).norm() / b.double().norm()).item())
    bits = torch.cat([g.flatten() for g in grads]).view(torch.int32)
    return {"wire_values": all(bool((g.to(wire).float() == g).all()) for g in grads),
            "grad_bits": hex(int((bits.long() * torch.arange(1, bits.numel() + 1)).sum())),
            "relative_error": worst}


def grads_are_bucket_views(model: nn.Module, buckets) -> bool:
    spans = [(b.buffer.data_ptr(), b.buffer.data_ptr() + b.buffer.numel() *
              b.buffer.element_size()) for b in buckets]
    for p in model.parameters():
        g = p.grad
        if g is None or not any(lo <= g.data_ptr() and g.data_ptr() + g.numel() *
                                g.element_size() <= hi for lo, hi in spans):
            return False
    return True


def train(px: parallax.Client, argv: List[str]) -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--mode", choices=["ddp", "opt"], default="ddp")
    a.add_argument("--cap", type=float, default=25.0)
    a.add_argument("--zero", choices=["zero", "none"], default="zero")
    a.add_argument("--passes", type=int, default=1)
    a.add_argument("--steps", type=int, default=6)
    a.add_argument("--fifo", action="store_true", help="prioritize=False")
    a.add_argument("--compression", choices=["none", "bf16", "fp16"], default="none")
    args = a.parse_args(argv)
    compression = getattr(pxt.Compression, args.compression)
    w = px.world
    submitted = record_priorities()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if args.mode == "ddp":
        ddp = pxt.DistributedDataParallel(model, client=px, bucket_cap_mb=args.cap,
                                          prioritize=not args.fifo, compression=compression)
        buckets, forward = ddp.buckets, ddp
    else:
        opt = pxt.DistributedOptimizer(opt, model.named_parameters(), client=px,
                                       bucket_cap_mb=args.cap,
                                       backward_passes_per_step=args.passes,
                                       prioritize=not args.fifo, compression=compression)
        buckets, forward = opt.buckets, model
    views = []
    for step in range(args.steps):
        opt.zero_grad(set_to_none=args.zero == "none")
        for micro in range(args.passes):
            x, y, flag = batch(step, micro, w.rank)
            (loss_of(forward, x, y, flag) / args.passes).backward()
        if args.mode == "opt":
            opt.synchronize()
        views.append(grads_are_bucket_views(model, buckets))
        if step == args.steps - 1:
            break  # the last gradients are compared with the reference's, before step()
        with opt.skip_synchronize() if args.mode == "opt" else _nothing():
            opt.step()
    ref = reference(w.world_size, args.steps, args.passes)
    if args.compression != "none":
        wire = torch.bfloat16 if args.compression == "bf16" else torch.float16
        emit(px, ok=True, world=w.__dict__, **compressed(model, ref, wire))
        return
    emit(px, ok=True, world=w.__dict__, views=views,
         buckets=[{"name": b.name, "params": b.params, "dtype": str(b.buffer.dtype),
                   "priority": b.priority} for b in buckets],
         submitted_priorities=sorted(submitted), **compare(model, ref))


def record_priorities() -> set:
    """The (variable, priority) pairs of every allreduce submitted from now on: what
    parallax.torch really passes to px_allreduce_ex, not only what BucketInfo says."""
    seen: set = set()
    original = parallax.DenseVariable.allreduce

    def allreduce(self, x, out=None, *, priority=0):
        seen.add((self.name, priority))
        return original(self, x, out, priority=priority)

    parallax.DenseVariable.allreduce = allreduce
    return seen


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def no_sync(px: parallax.Client, argv: List[str]) -> None:
    """Microbatch 0 under no_sync (local only: no bucket operation, local gradients), then
    microbatch 1 synchronized: the mean over workers of both microbatches' gradients."""
    w = px.world
    model = Net()
    ddp = pxt.DistributedDataParallel(model, client=px, name="nosync")
    ops = lambda: [b.variable.stats().ops for b in ddp.buckets]  # noqa: E731
    before = ops()
    step = 1  # every worker uses extra
    with ddp.no_sync():
        loss_of(ddp, *batch(step, 0, w.rank)).backward()
    during = ops()
    local = Net()
    loss_of(local, *batch(step, 0, w.rank)).backward()
    local_equal = all(torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)
                      for p, q in zip(model.parameters(), local.parameters()))
    loss_of(ddp, *batch(step, 1, w.rank)).backward()
    after = ops()
    ref = Net()
    for micro in range(2):
        loss_of(ref, *global_batch(step, micro, w.world_size)).backward()
    emit(px, ok=True, ops=[before, during, after], local_equal=local_equal,
         views=grads_are_bucket_views(model, ddp.buckets), **compare(model, ref))


def broadcast(px: parallax.Client, argv: List[str]) -> None:
    """Different initial weights and optimizer states per rank; after the broadcasts every
    rank holds rank 1's. Uses the default client (client=None)."""
    assert pxt.client() is px
    model = Net(seed=10 + px.rank)
    model.register_buffer("flags", torch.tensor([px.rank % 2 == 0, True]))  # bool: bytes
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (px.rank + 1))
    loss_of(model, *batch(0, 0, px.rank)).backward()
    opt.step()
    pxt.broadcast_parameters(model.state_dict(), root_rank=1)
    pxt.broadcast_optimizer_state(opt, root_rank=1)
    state = opt.state[model.fc1.weight]
    emit(px, ok=True, weights=sum(p.double().sum().item() for p in model.state_dict().values()),
         flags=model.flags.tolist(), lr=opt.param_groups[0]["lr"],
         betas=list(opt.param_groups[0]["betas"]), exp_avg=state["exp_avg"].double().sum().item(),
         step=float(state["step"]))


def mismatch(px: parallax.Client, argv: List[str]) -> None:
    """Rank 1 wraps a model with another hidden size."""
    model = Net(hidden=32 if px.rank != 1 else 33)
    try:
        pxt.DistributedDataParallel(model, client=px, name="mm", init_sync=False)
    except parallax.ParallaxError as e:
        emit(px, ok=True, error=type(e).__name__, status=e.status_name, message=e.message)
        return
    emit(px, ok=False)


class SlowBackward(torch.autograd.Function):
    """Identity whose backward says so and sleeps: the buckets of the layers after it are
    in flight while it sleeps, and the test kills the daemon then."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        print("in-backward", flush=True)
        time.sleep(3)
        return g


class SlowNet(Net):
    slow = False

    def forward(self, x: torch.Tensor, use_extra: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.slow:
            h = SlowBackward.apply(h)
        h = torch.tanh(self.fc2(h + use_extra[:, None] * self.extra))
        return self.fc3(h) * self.scale.float()


def dies(px: parallax.Client, argv: List[str]) -> None:
    """Trains until the daemon is killed mid-backward: an exception from backward()."""
    model = SlowNet()
    ddp = pxt.DistributedDataParallel(model, client=px, bucket_cap_mb=0.001, name="dies")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.monotonic()
    step = 0
    try:
        for step in range(100):
            model.slow = step >= 2
            loss = loss_of(ddp, *batch(step, 0, px.rank))
            t0 = time.monotonic()
            loss.backward()
            opt.step()
            opt.zero_grad()
    except parallax.ParallaxError as e:
        emit(px, ok=True, error=type(e).__name__, status=e.status_name, message=e.message,
             seconds=time.monotonic() - t0, step=step)
        return
    emit(px, ok=False)


SCENARIOS = {f.__name__: f for f in (train, no_sync, broadcast, mismatch, dies)}

if __name__ == "__main__":
    scenario = SCENARIOS[sys.argv[1]]
    client = pxt.client()  # the default client, from PARALLAX_* as a launcher sets it
    client.op_timeout = 60
    scenario(client, sys.argv[2:])
    if scenario is not dies:
        # A worker that leaves fails the job for the others: leave together.
        client.barrier(60)
    client.close()
