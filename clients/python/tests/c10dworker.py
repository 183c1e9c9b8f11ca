"""Workers of the torch.distributed backend's tests (test_torch_backend.py): each scenario
calls init_process_group("parallax") the way unchanged torch code does, checks its results
against references every rank computes alone, and writes a JSON result (last stdout line,
or $PXPY_RESULT_DIR/<rank>.json under px-cluster).

    c10dworker.py SCENARIO [key=value ...]

The group's store is a FileStore at $PXPY_STORE. order=reversed gives torch ranks in the
reverse of the daemons' (node-major) order, as a launcher that numbers nodes otherwise
would: every rank-ordered result must still come out in torch's order.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import parallax.torch as pxt

REDUCE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                 torch.int64]
MOVE_DTYPES = REDUCE_DTYPES + [torch.uint8, torch.int8, torch.int16, torch.bool,
                               torch.complex64]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}


def emit(**result):
    line = json.dumps(result)
    out_dir = os.environ.get("PXPY_RESULT_DIR")
    if out_dir:
        with open(os.path.join(out_dir, f"{result['rank']}.json"), "w") as f:
            f.write(line)
    print(line, flush=True)


def init(options, backend="parallax"):
    """init_process_group as user code calls it; returns (torch rank, world size, the
    daemons' rank)."""
    client = pxt.client()
    world = client.world
    rank = world.rank
    if options.get("order") == "reversed":
        rank = world.world_size - 1 - world.rank
    timeout = timedelta(seconds=float(options.get("timeout", 120)))
    store = dist.FileStore(os.environ["PXPY_STORE"], world.world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world.world_size,
                            timeout=timeout)
    assert dist.get_backend() == backend, dist.get_backend()
    return rank, world.world_size, world.rank


def data(rank, count, dtype, salt=0):
    """Rank's input: small integers, exact in every dtype and in every order of summation."""
    i = torch.arange(count, dtype=torch.int64)
    values = (i * 7 + (rank + 1) * 13 + salt * 5) % 11 - 5
    if dtype == torch.bool:
        return values > 0
    if dtype == torch.uint8:
        return (values + 5).to(dtype)
    if dtype.is_complex:
        return torch.complex(values.float(), (values * 2).float()).to(dtype)
    return values.to(dtype)


def reference(inputs, op):
    stacked = torch.stack([t.to(torch.float64) for t in inputs])
    if op == "sum":
        result = stacked.sum(0)
    elif op == "min":
        result = stacked.min(0).values
    elif op == "max":
        result = stacked.max(0).values
    elif op == "product":
        result = stacked.prod(0)
    else:
        result = stacked.sum(0) / len(inputs)
        if not inputs[0].is_floating_point():   # integers truncate toward zero
            result = torch.trunc(result)
    return result.to(inputs[0].dtype)


def expect_error(fn, *needles):
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        missing = [n for n in needles if n not in text]
        assert not missing, f"the error lacks {missing}: {text}"
        return text
    raise AssertionError(f"no error; expected one naming {needles}")


def collectives(options):
    rank, world, daemon_rank = init(options)
    counts = [1, 777, 40000]
    checked = 0
    for dtype in REDUCE_DTYPES:
        for count in counts:
            inputs = [data(r, count, dtype) for r in range(world)]
            for name, op in OPS.items():
                t = inputs[rank].clone()
                dist.all_reduce(t, op=op)
                assert torch.equal(t, reference(inputs, name)), (dtype, count, name)
                checked += 1
            # reduce_scatter: rank r's list holds one block per rank
            blocks = [[data(r, count, dtype, salt=b) for b in range(world)]
                      for r in range(world)]
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(out, blocks[rank], op=dist.ReduceOp.MAX)
            assert torch.equal(out, reference([blocks[r][rank] for r in range(world)], "max"))
            flat = torch.cat(blocks[rank])
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, flat)
            assert torch.equal(out, reference([blocks[r][rank] for r in range(world)], "sum"))
            root = world - 1
            t = inputs[rank].clone()
            dist.reduce(t, dst=root)
            if rank == root:
                assert torch.equal(t, reference(inputs, "sum"))
            else:
                assert torch.equal(t, inputs[rank])   # left as given
            checked += 4
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint8)), "all_reduce",
                 "Byte")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BOR),
                 "all_reduce", "bitwise")
    for dtype in MOVE_DTYPES:
        for count in counts:
            inputs = [data(r, count, dtype) for r in range(world)]
            for root in (0, world - 1):
                t = inputs[rank].clone() if rank == root else torch.zeros(count, dtype=dtype)
                dist.broadcast(t, src=root)
                assert torch.equal(t, inputs[root]), (dtype, count, root)
            gathered = [torch.zeros(count, dtype=dtype) for _ in range(world)]
            dist.all_gather(gathered, inputs[rank])
            assert all(torch.equal(gathered[r], inputs[r]) for r in range(world)), dtype
            out = torch.zeros(world * count, dtype=dtype)
            dist.all_gather_into_tensor(out, inputs[rank])
            assert torch.equal(out, torch.cat(inputs)), dtype
            # all_to_all_single: equal blocks of `count` rows; rank r's block k is (r, k)'s.
            sends = [torch.cat([data(r, count, dtype, salt=k) for k in range(world)])
                     for r in range(world)]
            out = torch.zeros(world * count, dtype=dtype)
            dist.all_to_all_single(out, sends[rank])
            want = torch.cat([data(s, count, dtype, salt=rank) for s in range(world)])
            assert torch.equal(out, want), (dtype, count)
            # uneven splits, some empty: rank s sends rank r (s + 2r) % 3 * count // 2 rows
            rows = [[(s + 2 * r) % 3 * count // 2 for r in range(world)] for s in range(world)]
            send = torch.cat([data(rank, rows[rank][r], dtype, salt=r) for r in range(world)])
            out = torch.zeros(sum(rows[s][rank] for s in range(world)), dtype=dtype)
            dist.all_to_all_single(out, send, output_split_sizes=[rows[s][rank] for s in range(world)],
                                   input_split_sizes=rows[rank])
            want = torch.cat([data(s, rows[s][rank], dtype, salt=rank) for s in range(world)])
            assert torch.equal(out, want), (dtype, count, "uneven")
            # all_to_all: lists of tensors of their own shapes
            outs = [torch.zeros(rows[s][rank], dtype=dtype) for s in range(world)]
            dist.all_to_all(outs, [data(rank, rows[rank][r], dtype, salt=r) for r in range(world)])
            assert all(torch.equal(outs[s], data(s, rows[s][rank], dtype, salt=rank))
                       for s in range(world)), (dtype, count, "lists")
            checked += 7
    # gather, scatter: to and from the last rank
    root = world - 1
    t = data(rank, 100, torch.float32)
    into = [torch.zeros(100) for _ in range(world)] if rank == root else None
    dist.gather(t, into, dst=root)
    if rank == root:
        assert all(torch.equal(into[r], data(r, 100, torch.float32)) for r in range(world))
    pieces = [data(r, 50, torch.int64, salt=9) for r in range(world)] if rank == root else None
    out = torch.zeros(50, dtype=torch.int64)
    dist.scatter(out, pieces, src=root)
    assert torch.equal(out, data(rank, 50, torch.int64, salt=9))
    # objects of growing sizes (pickled into uint8 tensors of sizes that change each call)
    for n in (1, 10, 1000, 20000):
        objects = [None] * world
        dist.all_gather_object(objects, {"rank": rank, "payload": "x" * (n * (rank + 1))})
        assert [o["rank"] for o in objects] == list(range(world))
        assert [len(o["payload"]) for o in objects] == [n * (r + 1) for r in range(world)]
        message = [f"from {rank}" * n] if rank == 0 else [None]
        dist.broadcast_object_list(message, src=0)
        assert message[0] == "from 0" * n
    checked += 3
    # asynchronous: the Work and its future
    t = torch.full((10,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.is_completed() and work.is_success()
    assert torch.equal(work.get_future().value()[0], t)
    assert torch.equal(t, torch.full((10,), float(sum(range(1, world + 1)))))
    dist.barrier()
    expect_error(lambda: dist.send(torch.ones(1), dst=(rank + 1) % world), "send",
                 "not supported")
    expect_error(lambda: dist.all_to_all_single(torch.zeros(world + 1), torch.ones(world + 1)),
                 "all_to_all_single", "equal blocks")
    pg = dist.distributed_c10d._get_default_group()
    registered = pg.variables_registered
    dist.destroy_process_group()
    emit(rank=rank, daemon_rank=daemon_rank, world=world, checked=checked,
         variables=registered, ok=True)


class TwoHeads(nn.Module):
    """Two linear heads on one input: every gradient is x^T times the loss's fixed weights
    (integers times halves), whatever the parameters are, so its sum over ranks is exact in
    any order (DDP divides it by the world size first: exact for a power of two), and the
    same update follows on every rank in either backend."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 8)
        self.b = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=1)


def make_model(kind):
    torch.manual_seed(1234)
    if kind == "exact":
        model = TwoHeads()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randint(-3, 4, p.shape).float())
        return model
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 32),
                         nn.Tanh(), nn.Linear(32, 4))


def batch(kind, step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    if kind == "exact":
        return torch.randint(-4, 5, (8, 16), generator=g).float(), None
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def ddp(options):
    """torch's own DistributedDataParallel over "parallax" and over "gloo", side by side on
    the same model, data and steps."""
    rank, world, daemon_rank = init(options)
    kind = options.get("data", "float")
    gloo = dist.new_group(backend="gloo")
    base = make_model(kind)
    models = {"parallax": copy.deepcopy(base), "gloo": copy.deepcopy(base)}
    wrapped = {
        "parallax": nn.parallel.DistributedDataParallel(models["parallax"],
                                                        bucket_cap_mb=0.001),
        "gloo": nn.parallel.DistributedDataParallel(models["gloo"], process_group=gloo,
                                                    bucket_cap_mb=0.001),
    }
    lr = 1 / 64 if kind == "exact" else 0.05
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=lr) for k, m in models.items()}
    weights = torch.arange(12 if kind == "exact" else 4, dtype=torch.float32) / 2 - 2
    steps = int(options.get("steps", 20))
    for step in range(steps):
        x, y = batch(kind, step, rank)
        for name in ("parallax", "gloo"):
            optimizers[name].zero_grad()
            out = wrapped[name](x)
            loss = (out * weights).sum() if kind == "exact" else ((out - y) ** 2).mean()
            loss.backward()
            optimizers[name].step()
    worst = 0.0  # the largest difference in a tensor, relative to that tensor's largest value
    equal = True
    for (n, a), (_, b) in zip(models["parallax"].state_dict().items(),
                              models["gloo"].state_dict().items()):
        if not torch.equal(a, b):
            equal = False
        if a.is_floating_point():
            worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item())
    moved = max((a - b).abs().max().item() for a, b in
                zip(models["parallax"].parameters(), base.parameters()))
    dist.destroy_process_group()
    emit(rank=rank, daemon_rank=daemon_rank, equal=equal, worst_relative=worst, moved=moved,
         ok=True)


def mismatch(options):
    """One rank calls all_reduce with another dtype (what=dtype) or size (what=size)."""
    rank, world, _ = init(options)
    odd = rank == world - 1
    what = options["what"]
    dtype = torch.float64 if (what == "dtype" and odd) else torch.float32
    count = 11 if (what == "size" and odd) else 10
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(count, dtype=dtype))
        error = None
    except RuntimeError as e:
        error = str(e)
    emit(rank=rank, error=error, seconds=time.monotonic() - t0, ok=True)
    os._exit(0)  # the group is broken; do not wait at exit


def late_rank(options):
    """The last rank connects to its daemon but never calls init_process_group."""
    client = pxt.client()
    if client.world.rank == client.world.world_size - 1:
        time.sleep(float(options.get("sleep", 30)))
        emit(rank=client.world.rank, skipped=True, ok=True)
        os._exit(0)
    t0 = time.monotonic()
    try:
        init(options)
        dist.all_reduce(torch.ones(4))
        error = None
    except Exception as e:  # the store's timeout is a RuntimeError too
        error = f"{type(e).__name__}: {e}"
    emit(rank=client.world.rank, error=error, seconds=time.monotonic() - t0, ok=True)
    os._exit(0)


def daemon_killed(options):
    """Collectives in a loop while the test SIGKILLs the daemon: every rank gets an error
    naming the lost daemon, within the deadline."""
    rank, world, _ = init(options)
    t0 = time.monotonic()
    error = None
    marker = os.environ.get("PXPY_MARKER")
    try:
        for step in range(100000):
            dist.all_reduce(torch.ones(1000))
            if step == 5 and marker and rank == 0:
                open(marker, "w").close()   # tells the test to kill the daemon
    except RuntimeError as e:
        error = str(e)
    emit(rank=rank, error=error, seconds=time.monotonic() - t0, ok=True)
    os._exit(0)


SCENARIOS = {"collectives": collectives, "ddp": ddp, "mismatch": mismatch,
             "late-rank": late_rank, "daemon-killed": daemon_killed}

if __name__ == "__main__":
    torch.set_num_threads(1)
    SCENARIOS[sys.argv[1]](dict(arg.split("=", 1) for arg in sys.argv[2:]))
