"""A worker process of the Python tests: `pyworker.py SCENARIO [ARGS]`.

Each scenario runs real operations through the parallax package against the daemon named
by the environment and prints one JSON line of results (also written to
$PXPY_RESULT_DIR/<rank>.json under px-cluster). Assertions about values across workers
are made by the tests; what one worker can check alone it checks here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import numpy as np

import parallax


def emit(px, **result):
    result.setdefault("rank", px.rank if px is not None else -1)
    line = json.dumps(result)
    out_dir = os.environ.get("PXPY_RESULT_DIR")
    if out_dir:
        with open(os.path.join(out_dir, f"{result['rank']}.json"), "w") as f:
            f.write(line)
    print(line, flush=True)


def dense(px):
    w = px.world
    n = 1000
    x = px.empty(n)                       # arena: reduced in place
    x[:] = np.arange(n, dtype=np.float32) * (w.rank + 1)
    var = px.dense("py.dense.sum", n)
    assert var.allreduce(x).wait() is x
    factor = sum(r + 1 for r in range(w.world_size))
    np.testing.assert_array_equal(x, np.arange(n, dtype=np.float32) * factor)

    y = np.full(7, float(w.rank), dtype=np.float64)   # ordinary memory, separate out
    out = np.zeros(7, dtype=np.float64)
    mean = px.dense("py.dense.mean", 7, "float64", op="mean")
    mean.allreduce(y, out).wait()
    np.testing.assert_allclose(out, np.full(7, (w.world_size - 1) / 2))

    i = np.array([w.rank, -w.rank], dtype=np.int64)
    mx = px.dense("py.dense.max", 2, np.int64, op="max")
    mx.allreduce(i).wait()
    assert i.tolist() == [w.world_size - 1, 0], i

    b = np.full(5, 100 + w.rank, dtype=np.int32)
    bvar = px.dense("py.bcast", 5, np.int32)
    bvar.broadcast(b, root=w.world_size - 1).wait()
    assert (b == 100 + w.world_size - 1).all(), b

    g = px.dense("py.gather", 3, np.float32)
    gathered = g.allgather(np.full(3, w.rank, dtype=np.float32)).wait()
    assert gathered.tolist() == [float(r) for r in range(w.world_size) for _ in range(3)]

    counts = [r + 1 for r in range(w.world_size)]
    gv = px.dense("py.gatherv", w.world_size, np.float32)
    v = gv.allgatherv(np.full(w.rank + 1, w.rank, dtype=np.float32), counts).wait()
    assert v.tolist() == [float(r) for r in range(w.world_size) for _ in range(r + 1)]

    # ABI 1.9: reduce-scatter (block k of rank r holds r + k), products, alltoall(v).
    n = w.world_size
    rs = px.dense("py.rscatter", 2, np.int64)
    mine = rs.reduce_scatter(np.repeat(np.arange(n) + w.rank, 2).astype(np.int64)).wait()
    assert mine.tolist() == [sum(r + w.rank for r in range(n))] * 2, mine
    prod = px.dense("py.prod", 3, np.float64, op="prod")
    p = np.full(3, 2.0)
    prod.allreduce(p).wait()
    assert p.tolist() == [2.0 ** n] * 3, p
    a2a = px.dense("py.a2a", 1, np.int32)
    got = a2a.alltoall(np.arange(n, dtype=np.int32) + 10 * w.rank).wait()
    assert got.tolist() == [10 * s + w.rank for s in range(n)], got
    send = [k + 1 for k in range(n)]          # rank r sends k + 1 elements to rank k
    recv = [w.rank + 1] * n
    a2av = px.dense("py.a2av", n, np.int32)
    data = np.concatenate([np.full(k + 1, 100 * w.rank + k, np.int32) for k in range(n)])
    got = a2av.alltoallv(data, send, recv).wait()
    assert got.tolist() == [100 * s + w.rank for s in range(n) for _ in range(w.rank + 1)], got

    stats = var.stats()
    assert stats.ops >= 1
    px.barrier(30)
    emit(px, world=w.__dict__, ok=True)


def torch_views(px):
    import torch
    w = px.world
    t = px.empty_tensor((4, 8))          # arena memory viewed as a tensor, no copy
    t.fill_(w.rank + 1)
    var = px.dense("py.torch", 32, torch.float32)
    var.allreduce(t).wait()
    total = sum(r + 1 for r in range(w.world_size))
    assert torch.equal(t, torch.full((4, 8), float(total))), t
    bf = px.empty_tensor(16, torch.bfloat16)
    bf.fill_(1.5)
    bvar = px.dense("py.bf16", 16, torch.bfloat16, op="sum")
    bvar.allreduce(bf).wait()
    assert torch.equal(bf.float(), torch.full((16,), 1.5 * w.world_size)), bf
    h = torch.full((3,), float(w.rank), dtype=torch.float16)   # an ordinary tensor
    hvar = px.dense("py.f16", 3, torch.float16, op="max")
    hvar.allreduce(h).wait()
    assert h.tolist() == [float(w.world_size - 1)] * 3
    emit(px, ok=True)


def sparse(px):
    w = px.world
    table = px.sparse("py.table", 100, 4, optimizer="sgd", lr=0.5, initializer="zeros",
                      aggregation="sum")
    idx = np.array([1, 5, 5, 99], dtype=np.int64)
    rows = table.pull(idx).wait()
    assert rows.shape == (4, 4) and not rows.any()
    grads = np.ones((4, 4), dtype=np.float32)
    table.push(idx, grads).wait()
    after = table.pull(idx).wait()
    # every worker pushed 1 for rows 1 and 99 and 2 (duplicate) for row 5; lr 0.5, summed
    expect = -0.5 * w.world_size * np.array([1, 2, 2, 1], dtype=np.float32)[:, None]
    np.testing.assert_allclose(after, np.broadcast_to(expect, (4, 4)))
    read = table.read([5]).wait()
    np.testing.assert_allclose(read, expect[1:2].repeat(4, 1))
    stats = table.stats()
    assert stats.pull_steps == 2 and stats.push_steps == 1, stats
    # A bf16 wire: the world's gradients of 1/3 (one node's sum, or each node's) rounded to
    # bf16 before they leave the node, the pulled rows rounded too; the shards stay f32.
    wire = px.sparse("py.wire", 100, 4, lr=0.5, wire_dtype="bf16")
    assert not wire.pull([7]).wait().any()  # pull step 0: push step 0 not yet seen
    wire.push([7], np.full((1, 4), 1 / 3, np.float32) * (2 / w.world_size)).wait()
    node_sum = np.float32(2 / 3) if w.node_count == 1 else np.float32(1 / 3)
    bf16 = {np.float32(2 / 3): np.float32(0.66796875), np.float32(1 / 3): np.float32(0.333984375)}
    expect = np.float32(-0.5) * bf16[node_sum] * w.node_count
    got = wire.pull([7]).wait()
    np.testing.assert_array_equal(got, np.full((1, 4), expect, np.float32))
    # Prefetch: pull step 1 issued before push step 0. Row 3 (pulled in step 0) comes once
    # the push is applied; row 50 (pulled by no one) may come ahead of it. Never stale.
    ahead = px.sparse("py.ahead", 100, 4, lr=0.5, prefetch=True)
    assert not ahead.pull([3]).wait().any()
    early = ahead.prefetch([3, 50])
    with pytest_raises(parallax.InvalidArgument, "was not pulled in pull step 0"):
        ahead.push([4], np.ones((1, 4), np.float32))
    ahead.push([3], np.ones((1, 4), np.float32)).wait()
    got = early.wait()
    np.testing.assert_array_equal(got[0], np.full(4, -0.5 * w.world_size, np.float32))
    assert not got[1].any()
    ahead.push([3, 50], np.zeros((2, 4), np.float32)).wait()
    assert ahead.stats().rows_served_ahead >= 0

    # A hot-row cache (a bounded table): rows 0-7 in every step are served from it on a
    # cluster, their gradients held, and the read after training sees every gradient once.
    with pytest_raises(parallax.InvalidArgument, "needs PX_BOUNDED"):
        px.sparse("py.hot.sync", 20, 4, cache_rows=8, cache_staleness=2)
    for wire in ("f32", "bf16"):  # bf16: held sums are rounded again as they leave (exact here)
        hot = px.sparse(f"py.hot.{wire}", 20, 4, lr=1.0, consistency="bounded", route="ps",
                        cache_rows=16, cache_staleness=2, wire_dtype=wire)
        for step in range(6):
            rows = list(range(8)) + [8 + step]
            hot.pull(rows).wait()
            hot.push(rows, np.ones((9, 4), np.float32)).wait()
        table = hot.read(list(range(20))).wait()
        want = np.zeros((20, 4), np.float32)
        want[:8] = -6.0 * w.world_size
        want[8:14] = -1.0 * w.world_size
        np.testing.assert_array_equal(table, want)
        s = hot.stats()
        if w.node_count > 1:
            assert s.cache_hits > 0 and s.cache_rows_flushed > 0, s
        else:
            assert s.cache_hits == s.cache_misses == 0, s  # one node: nothing to cache
    emit(px, ok=True)


def sparse_group(px):
    """Tables of one group: one pull and one push step over several tables (repeats
    allowed), each table's own rows through its handle, a bad index naming its table."""
    w = px.world
    group = px.sparse_group("py.group", [("user", 10), ("item", 20)], 4, lr=0.5,
                            aggregation="sum")
    user, item = group["user"], group["item"]
    assert (user.offset, item.offset, group.rows) == (0, 10, 30)
    rows = group.pull_tables([("item", [0, 19]), (user, [9]), ("item", [0])]).wait()
    assert rows.shape == (4, 4) and not rows.any()
    group.push_tables([(user, [9]), ("item", [19, 19])],
                      np.ones((3, 4), np.float32)).wait()
    after = group.pull_tables([(item, [19]), (user, [9, 0])]).wait()
    expect = np.float32(-0.5) * w.world_size * np.array([2, 1, 0], np.float32)[:, None]
    np.testing.assert_allclose(after, np.broadcast_to(expect, (3, 4)))
    # A table's own rows, and the group's: item's row 19 is the group's row 29.
    np.testing.assert_allclose(item.read([19]).wait(), group.read([29]).wait())
    assert group.stats().pull_steps == 2 and user.stats().push_steps == 1
    with pytest_raises(parallax.RowIndexError, "index 10 of table 'user', outside its 10 rows"):
        user.read([10]).wait()
    with pytest_raises(parallax.InvalidArgument, "is not one of its tables"):
        group.pull_tables([("nope", [0])])
    group.push_tables([(user, np.zeros(0, np.int64))], np.zeros((0, 4), np.float32)).wait()
    emit(px, ok=True)


class pytest_raises:
    """with pytest_raises(exc, text): the block raises exc with text in its message."""

    def __init__(self, exc_type, text):
        self.exc_type, self.text = exc_type, text

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            raise AssertionError(f"no {self.exc_type.__name__} raised")
        if not issubclass(exc_type, self.exc_type) or self.text not in str(exc):
            return False
        return True


def torch_sparse(px):
    import torch
    table = px.sparse("py.ttable", 10, 3, initializer="uniform", seed=7)
    idx = torch.tensor([0, 9, 3], dtype=torch.int32)     # copied to int64
    rows = table.pull(idx).wait()
    assert isinstance(rows, torch.Tensor) and rows.shape == (3, 3)
    assert rows.abs().max() <= 0.05 and rows.abs().sum() > 0
    table.push(idx, torch.zeros(3, 3)).wait()
    emit(px, ok=True, row0=rows[0].tolist())


def asyncio_waits(px):
    w = px.world

    async def main():
        var = px.dense("py.async", 64)
        xs = [np.full(64, float(w.rank), dtype=np.float32) for _ in range(8)]
        reqs = [var.allreduce(x) for x in xs]       # steps 0..7 in flight together
        results = await asyncio.gather(*reqs)
        total = sum(range(w.world_size))
        assert all((r == total).all() for r in results)
        bad = px.sparse("py.async.sparse", 10, 2)
        try:
            await bad.pull(np.array([3, 12]))
        except parallax.RowIndexError as e:
            return str(e)
        raise AssertionError("index 12 of 10 rows was accepted")

    message = asyncio.run(asyncio.wait_for(main(), 60))
    emit(px, ok=True, index_error=message)


def errors(px):
    """Bad input, one worker: each is a typed exception naming what was wrong."""
    import torch
    seen = {}

    def expect(name, exc_type, fn):
        try:
            fn()
        except exc_type as e:
            assert isinstance(e, parallax.ParallaxError), type(e)
            seen[name] = {"type": type(e).__name__, "status": e.status_name,
                          "message": e.message}
            return
        raise AssertionError(f"{name}: no {exc_type.__name__} raised")

    var = px.dense("py.err", 8, np.float32)
    expect("dtype", parallax.InvalidArgument,
           lambda: var.allreduce(np.zeros(8, dtype=np.float64)))
    expect("count", parallax.InvalidArgument, lambda: var.allreduce(np.zeros(9, np.float32)))
    expect("noncontiguous", parallax.InvalidArgument,
           lambda: var.allreduce(np.zeros(16, np.float32)[::2]))
    expect("noncontiguous_tensor", parallax.InvalidArgument,
           lambda: var.allreduce(torch.zeros(8, 2)[:, 0]))
    expect("device_tensor", parallax.InvalidArgument,
           lambda: var.allreduce(torch.empty(8, device="meta")))
    expect("device_tensor_allgather", parallax.InvalidArgument,
           lambda: var.allgather(torch.empty(8, device="meta")))
    expect("object", parallax.InvalidArgument, lambda: var.allreduce([0.0] * 8))
    expect("unknown_dtype", parallax.InvalidArgument, lambda: px.dense("py.u8", 4, np.uint8))
    expect("mismatch", parallax.Mismatch, lambda: px.dense("py.err", 9, np.float32))
    table = px.sparse("py.err.table", 10, 2)
    expect("index", parallax.RowIndexError, lambda: table.pull([1, 10]).wait())
    expect("rows_shape", parallax.InvalidArgument,
           lambda: table.push([1], np.zeros((1, 3), np.float32)))
    expect("float_indices", parallax.InvalidArgument, lambda: table.pull([1.5]))
    expect("optimizer", parallax.InvalidArgument, lambda: px.sparse("x", 1, 1, optimizer="sgdd"))
    expect("wire_route", parallax.InvalidArgument,
           lambda: px.sparse("x", 1, 1, route="allgatherv", wire_dtype="bf16"))
    expect("wire_dtype", parallax.InvalidArgument, lambda: px.sparse("x", 1, 1, wire_dtype="f8"))
    expect("prefetch_option", parallax.InvalidArgument, lambda: table.prefetch([1]))
    r = var.allreduce(np.zeros(8, np.float32))
    r.wait()
    assert r.test()
    emit(px, ok=True, seen=seen)


def mismatch_pair(px):
    """Two workers register the same name with different counts."""
    try:
        px.dense("py.pair", 4 + px.rank, np.float32)
    except parallax.Mismatch as e:
        emit(px, ok=True, error=e.status_name, message=e.message)
        return
    emit(px, ok=True, error=None)


def daemon_dies(px):
    """Allreduces until the daemon is killed under us: an exception, never a hang."""
    var = px.dense("py.dies", 1 << 16)
    x = px.zeros(1 << 16)
    print("ready", flush=True)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 60:
            var.allreduce(x).wait(30)
    except parallax.ParallaxError as e:
        emit(px, ok=True, error=type(e).__name__, status=e.status_name, message=e.message,
             seconds=time.monotonic() - t0)
        return
    emit(px, ok=False)


def late_peer(px):
    """Rank 1 joins step 0 late: rank 0's first wait passes its deadline, the request
    stays valid, and a second wait gets the result."""
    var = px.dense("py.late", 4)
    x = np.ones(4, np.float32)
    timed_out = None
    if px.rank == 1:
        time.sleep(1.5)
    req = var.allreduce(x)
    if px.rank == 0:
        try:
            req.wait(0.3)
        except parallax.DeadlineExceeded as e:
            timed_out = e.message
    req.wait(30)
    assert (x == 2).all()
    emit(px, ok=True, timed_out=timed_out)


def sparse_lr(px):
    """px_set_sparse_lr: each push step applied with the rate set before it, on every
    node; with 2 local workers, a rate another worker disputes or never set is refused."""
    w = px.world
    t = px.sparse("py.lr", 10, 2, optimizer="sgd", lr=1.0, initializer="zeros",
                  aggregation="sum")
    idx = np.array([3], np.int64)

    def step(grad=1.0):
        t.pull(idx).wait()
        t.push(idx, np.full((1, 2), grad, np.float32)).wait()

    with pytest_raises(parallax.InvalidArgument, "not finite and >= 0"):
        t.learning_rate = float("nan")
    step()                    # push step 0 at the registered 1.0
    t.learning_rate = 0.25
    assert t.learning_rate == 0.25
    step()                    # push step 1 at 0.25
    t.learning_rate = 0.5
    step()                    # push step 2 at 0.5
    got = t.pull(idx).wait()  # pull step 3 sees push step 2
    np.testing.assert_allclose(got, np.full((1, 2), -w.world_size * 1.75, np.float32))
    t.push(idx, np.zeros((1, 2), np.float32)).wait()
    # A rate of 0, as a warm-up's first step has (torch takes it): nothing moves, until 1.
    zero = px.sparse("py.lr0", 10, 2, optimizer="sgd", lr=0.0, initializer="zeros")
    for rate in (0.0, 1.0):
        zero.learning_rate = rate
        zero.pull(idx).wait()
        zero.push(idx, np.ones((1, 2), np.float32)).wait()
    np.testing.assert_allclose(zero.pull(idx).wait(), np.full((1, 2), -w.world_size, np.float32))
    zero.push(idx, np.zeros((1, 2), np.float32)).wait()
    seen = {}
    if w.local_size == 2:
        # Another rate for the same push step (4): refused to the second worker to ask.
        if w.local_rank == 0:
            t.learning_rate = 0.1
        px.barrier(30)
        if w.local_rank == 1:
            try:
                t.learning_rate = 0.2
                raise AssertionError("a disputed rate was taken")
            except parallax.Mismatch as e:
                seen["disputed"] = str(e)
            t.learning_rate = 0.1
        step()                # push step 4 at 0.1
        got = t.pull(idx).wait()
        np.testing.assert_allclose(got, np.full((1, 2), -w.world_size * 1.85, np.float32),
                                   rtol=1e-6)
        t.push(idx, np.zeros((1, 2), np.float32)).wait()
        # Worker 0 sets a rate from push step 6, worker 1 pushes it without: the step fails
        # for both, naming them.
        if w.local_rank == 0:
            t.learning_rate = 2.0
        t.pull(idx).wait()
        try:
            t.push(idx, np.ones((1, 2), np.float32)).wait()
            raise AssertionError("a push without the new rate was taken")
        except parallax.InvalidArgument as e:
            seen["unset"] = str(e)
    emit(px, ok=True, seen=seen)


def world_only(px):
    emit(px, world=px.world.__dict__, settings=parallax.resolve_settings())


SCENARIOS = {f.__name__: f for f in (dense, torch_views, sparse, sparse_group, torch_sparse,
                                     asyncio_waits,
                                     errors, mismatch_pair, daemon_dies, late_peer, world_only,
                                     sparse_lr)}

if __name__ == "__main__":
    scenario = SCENARIOS[sys.argv[1]]
    with parallax.Client(timeout=30, op_timeout=60) as client:
        scenario(client)
        if scenario is not daemon_dies:
            # A worker that leaves fails the job for the others (as in Horovod): leave
            # together, once everyone's operations are done.
            client.barrier(60)
