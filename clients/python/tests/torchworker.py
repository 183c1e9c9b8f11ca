"""Worker scenarios for parallax.torch's sparse layers: `torchworker.py SCENARIO`.

Each worker builds the same deterministic global batches, trains on its slice through the
daemons, and compares with a plain PyTorch reference trained on the whole global batch in
the same process (same initial table, same optimizer), so every worker checks the result
itself.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import parallax
import parallax.torch as pxt
from pyworker import emit

ROWS, DIM, PER_WORKER, STEPS = 50, 6, 8, 4


def _batches(world_size: int):
    g = torch.Generator().manual_seed(1234)
    for _ in range(STEPS):
        yield torch.randint(0, ROWS, (world_size * PER_WORKER,), generator=g)


def embedding_matches_reference(px):
    # argv[2:]: table options as key=value (e.g. route=alltoall alltoall_split=columns).
    # pipeline=1: each next batch prefetched between forward and backward (prefetch=True);
    # pipeline=train: the same through pxt.TrainPipeline driving an iterator of the batches.
    options = dict(arg.split("=", 1) for arg in sys.argv[2:])
    mode = options.pop("pipeline", "0")
    pipeline = mode == "1"
    if mode != "0":
        options["prefetch"] = True
    torch.manual_seed(0)
    w0 = torch.randn(ROWS, DIM)
    emb = pxt.Embedding(ROWS, DIM, name="t.emb", client=px, optimizer="adagrad", lr=0.3,
                        initial_accumulator=0.1, epsilon=1e-10, **options)
    emb.load_state_dict({"weight": w0})
    ref = nn.Embedding(ROWS, DIM)
    ref.weight.data.copy_(w0)
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.3, initial_accumulator_value=0.1,
                              eps=1e-10)
    rank, world = px.rank, px.world_size
    target = torch.linspace(-1, 1, DIM)
    batches = list(_batches(world))
    mine = [b[rank * PER_WORKER:(rank + 1) * PER_WORKER].reshape(2, -1) for b in batches]
    train = pxt.TrainPipeline(emb, [], forward=lambda m, b: ((m(b) - target) ** 2).mean(),
                              prefetch=emb.prefetch)
    it = iter(mine)
    for step, batch in enumerate(batches):
        if mode == "train":
            train.progress(it)
        else:
            loss = ((emb(mine[step]) - target) ** 2).mean()
            if pipeline and step + 1 < len(batches):
                emb.prefetch(mine[step + 1])
            loss.backward()
        opt.zero_grad()
        ((ref(batch) - target) ** 2).mean().backward()
        opt.step()
    if mode == "train":
        try:
            train.progress(it)
            raise AssertionError("progress() past the last batch returned")
        except StopIteration:
            pass
        assert train.steps == len(batches)
    emb.synchronize()
    px.barrier(30)
    got = emb.state_dict()["weight"]
    err = ((got - ref.weight.data).abs() / ref.weight.data.abs().clamp_min(1e-3)).max().item()
    assert err < 1e-5, err
    emit(px, ok=True, max_rel_err=err, served_ahead=emb.variable.stats().rows_served_ahead)


def embedding_bag_and_eval(px):
    torch.manual_seed(1)
    w0 = torch.randn(ROWS, DIM)
    bag = pxt.EmbeddingBag(ROWS, DIM, mode="sum", name="t.bag", client=px)
    bag.load_state_dict({"weight": w0})
    ref = nn.EmbeddingBag(ROWS, DIM, mode="sum")
    ref.weight.data.copy_(w0)
    idx = torch.tensor([3, 7, 7, 49, 0])
    offsets = torch.tensor([0, 2])
    bag.eval()                                   # eval: reads, no step, no backward needed
    torch.testing.assert_close(bag(idx, offsets), ref(idx, offsets))
    with torch.no_grad():
        torch.testing.assert_close(bag(idx.reshape(1, 5)), ref(idx.reshape(1, 5)))
    assert bag.variable.stats().pull_steps == 0
    # padding_idx (negative: from the end) and include_last_offset, as torch's.
    padded = pxt.EmbeddingBag(ROWS, DIM, mode="mean", name="t.padded", client=px,
                              padding_idx=-1, include_last_offset=True, optimizer="sgd",
                              lr=1.0)
    assert padded.padding_idx == ROWS - 1
    assert float(padded.state_dict()["weight"][ROWS - 1].abs().sum()) == 0.0
    w1 = padded.state_dict()["weight"]
    ref_padded = nn.EmbeddingBag(ROWS, DIM, mode="mean", padding_idx=-1,
                                 include_last_offset=True)
    ref_padded.weight.data.copy_(w1)
    idx = torch.tensor([ROWS - 1, 4, ROWS - 1, 5, 4])
    offsets = torch.tensor([0, 2, 5])
    torch.testing.assert_close(padded(idx, offsets), ref_padded(idx, offsets))
    padded(idx, offsets).sum().backward()
    padded.synchronize()
    after = padded.state_dict()["weight"]
    assert torch.equal(after[ROWS - 1], w1[ROWS - 1])  # no gradient for the padding row
    assert not torch.equal(after[4], w1[4])
    emb = pxt.Embedding(ROWS, DIM, name="t.padded_emb", client=px, padding_idx=3)
    assert float(emb.state_dict()["weight"][3].abs().sum()) == 0.0
    emit(px, ok=True)


def sampled_softmax_matches_reference(px):
    """The layer's loss and updated table equal a plain-torch computation of TF's
    sampled_softmax_loss on the global batch with the same sample."""
    classes, dim, sampled = 40, 5, 12
    torch.manual_seed(2)
    w0 = torch.randn(classes, dim + 1) * 0.3
    pipeline = "pipeline=1" in sys.argv[2:]  # each next step's rows prefetched
    layer = pxt.SampledSoftmax(classes, dim, sampled, name="t.softmax", client=px,
                               optimizer="sgd", lr=0.5, sampler_seed=9, prefetch=pipeline)
    layer.load_state_dict({"weight": w0})
    ref_w = w0.clone().requires_grad_(True)
    sampler = pxt.LogUniformSampler(classes, 9)
    rank, world = px.rank, px.world_size
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(world * 4, dim, generator=g),
             torch.randint(0, classes, (world * 4,), generator=g)) for _ in range(3)]
    losses = []
    sl = slice(rank * 4, (rank + 1) * 4)
    for step, (hidden, targets) in enumerate(data):
        loss = layer(hidden[sl], targets[sl])
        if pipeline and step + 1 < len(data):
            layer.prefetch(data[step + 1][1][sl])
        loss.backward()
        # reference: the same formula on the whole batch, dense
        s = sampler.sample(sampled, step)
        ref_loss = pxt.sampled_softmax_loss(hidden, targets, s, ref_w[targets], ref_w[s],
                                            sampler)
        ref_loss.backward()
        with torch.no_grad():
            ref_w -= 0.5 * ref_w.grad
            ref_w.grad = None
        losses.append(loss.item())
    layer.synchronize()
    px.barrier(30)
    torch.testing.assert_close(layer.state_dict()["weight"], ref_w.detach(), rtol=1e-5,
                               atol=1e-6)
    emit(px, ok=True, losses=losses)


def bad_input(px):
    emb = pxt.Embedding(10, 2, name="t.bad", client=px)
    seen = {}
    for name, fn, exc in (
            ("float_indices", lambda: emb(torch.tensor([1.0])), parallax.InvalidArgument),
            ("meta_indices", lambda: emb(torch.empty(2, dtype=torch.int64, device="meta")),
             parallax.InvalidArgument),
            ("out_of_range", lambda: emb(torch.tensor([3, 10])), parallax.RowIndexError),
            ("unknown_option", lambda: pxt.Embedding(4, 2, name="t.x", client=px, momentum=1),
             parallax.InvalidArgument),
            ("load_shape", lambda: emb.load_state_dict({"weight": torch.zeros(3, 2)}),
             parallax.InvalidArgument),
            ("pipeline_no_prefetch", lambda: pxt.TrainPipeline(nn.Linear(2, 2)),
             parallax.InvalidArgument),
            ("pipeline_no_loss", lambda: pxt.TrainPipeline(
                emb, forward=lambda m, b: "loss", prefetch=lambda b: None).progress(
                    iter([torch.tensor([1])])), parallax.InvalidArgument)):
        try:
            fn()
        except exc as e:
            seen[name] = e.message
            continue
        raise AssertionError(f"{name}: no {exc.__name__}")
    emit(px, ok=True, seen=seen)


def checkpoint_and_restore(px):
    import os
    path = sys.argv[2]
    emb = pxt.Embedding(20, 3, name="t.ckpt", client=px, initializer="uniform", seed=3)
    if os.environ.get("PXPY_PHASE") == "restore":
        emit(px, ok=True, weight=emb.state_dict()["weight"].tolist())
        return
    out = emb(torch.tensor([[1, 2], [2, 19]]))
    out.sum().backward()
    emb.synchronize()
    px.barrier(30)
    px.checkpoint(path, 30)
    emit(px, ok=True, weight=emb.state_dict()["weight"].tolist())


def tables_looked_up_more_than_once(px):
    """One Embedding looked up three times a step (two features of one table, and the same
    table tied as the output's candidate rows) and one EmbeddingBag twice, Adagrad on both:
    the same tables as nn.Embedding / nn.EmbeddingBag trained on the global batch. At step 2
    a training forward has no backward (a logged loss): the next forward joins its step, and
    the first training lookup of each table after that backward raises the misuse."""
    steps, per = 5, 6
    torch.manual_seed(3)
    w_emb, w_bag = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    adagrad = dict(optimizer="adagrad", lr=0.3, initial_accumulator=0.1, epsilon=1e-10)
    emb = pxt.Embedding(ROWS, DIM, name="t.tied", client=px, **adagrad)
    bag = pxt.EmbeddingBag(ROWS, DIM, mode="sum", name="t.bag2", client=px, **adagrad)
    emb.load_state_dict({"weight": w_emb})
    bag.load_state_dict({"weight": w_bag})
    ref_emb, ref_bag = nn.Embedding(ROWS, DIM), nn.EmbeddingBag(ROWS, DIM, mode="sum")
    ref_emb.weight.data.copy_(w_emb)
    ref_bag.weight.data.copy_(w_bag)
    opt = torch.optim.Adagrad(list(ref_emb.parameters()) + list(ref_bag.parameters()), lr=0.3,
                              initial_accumulator_value=0.1, eps=1e-10)
    rank, world = px.rank, px.world_size
    g = torch.Generator().manual_seed(77)
    misuse = []

    def loss_of(e, b, user, item, cand, hist, offsets):
        # Two features of one table (user, item), the same table's rows as the output's
        # candidates (tied), and one bag looked up twice (history, and the item as a bag).
        context = e(user) * e(item) + b(hist, offsets) + b(item.reshape(-1, 1))
        return ((context[:, None, :] * e(cand)).sum(-1) - 1.0).pow(2).mean()

    for step in range(steps):
        n = world * per
        user, item = (torch.randint(0, ROWS, (n,), generator=g) for _ in range(2))
        cand = torch.randint(0, ROWS, (n, 3), generator=g)
        hist = torch.randint(0, ROWS, (n * 2,), generator=g)
        lo, hi = rank * per, (rank + 1) * per
        mine = (user[lo:hi], item[lo:hi], cand[lo:hi], hist[2 * lo:2 * hi],
                torch.arange(0, 2 * per, 2))
        if step == 2:
            loss_of(emb, bag, *mine).item()  # training mode, no backward
        if step == 3:  # each table tells it once, before any step begins
            for layer, args in ((emb, (mine[0],)), (bag, (mine[3], mine[4]))):
                try:
                    layer(*args)
                    raise AssertionError(f"{layer.table_name}: no misuse error")
                except parallax.InvalidArgument as e:
                    misuse.append(str(e))
        loss_of(emb, bag, *mine).backward()
        opt.zero_grad()
        loss_of(ref_emb, ref_bag, user, item, cand, hist,
                torch.arange(0, 2 * n, 2)).backward()
        opt.step()
    emb.synchronize()
    bag.synchronize()
    px.barrier(30)
    errs = []
    for layer, ref in ((emb, ref_emb), (bag, ref_bag)):
        got = layer.state_dict()["weight"]
        errs.append(((got - ref.weight.data).abs() /
                     ref.weight.data.abs().clamp_min(1e-3)).max().item())
    assert max(errs) < 1e-4, errs
    stats = emb.variable.stats()
    emit(px, ok=True, max_rel_err=max(errs), pull_steps=stats.pull_steps,
         push_steps=stats.push_steps, misuse=misuse)


def collection_matches_reference(px):
    """An EmbeddingBagCollection of three tables in two widths (so two groups), one table
    with two features (one of them a variable-length history, mean-pooled), Adagrad: the
    same as one nn.EmbeddingBag per table trained on the global batch. Each group takes one
    pull and one push step per training step. An EmbeddingCollection's eval lookup reads
    the loaded rows."""
    steps, per = 4, 5
    configs = [pxt.EmbeddingBagConfig(50, 6, "user", ["user_id"]),
               pxt.EmbeddingBagConfig(40, 6, "item", ["item_id", "hist"], pooling="mean"),
               pxt.EmbeddingBagConfig(30, 4, "cat", ["cat"])]
    adagrad = dict(optimizer="adagrad", lr=0.3, initial_accumulator=0.1, epsilon=1e-10)
    ebc = pxt.EmbeddingBagCollection(configs, name="t.ebc", client=px, **adagrad)
    torch.manual_seed(5)
    init = {c.name: torch.randn(c.num_embeddings, c.embedding_dim) for c in configs}
    ebc.load_state_dict({f"embedding_bags.{n}.weight": w for n, w in init.items()})
    assert sorted(ebc.state_dict()) == sorted(f"embedding_bags.{c.name}.weight"
                                              for c in configs)
    refs = {c.name: nn.EmbeddingBag(c.num_embeddings, c.embedding_dim,
                                    mode="mean" if c.pooling == "mean" else "sum")
            for c in configs}
    for n, bag in refs.items():
        bag.weight.data.copy_(init[n])
    opt = torch.optim.Adagrad([b.weight for b in refs.values()], lr=0.3,
                              initial_accumulator_value=0.1, eps=1e-10)
    table_of = {"user_id": "user", "item_id": "item", "hist": "item", "cat": "cat"}
    features = ["user_id", "item_id", "hist", "cat"]
    rank, world = px.rank, px.world_size
    g = torch.Generator().manual_seed(91)

    def batch(n):
        """{feature: lengths (n), values}, random ids within each feature's table."""
        out = {}
        for f in features:
            lo, hi = {"hist": (0, 4), "cat": (1, 3)}.get(f, (1, 2))
            lens = torch.randint(lo, hi, (n,), generator=g)
            rows = next(c.num_embeddings for c in configs if c.name == table_of[f])
            out[f] = (lens, torch.randint(0, rows, (int(lens.sum()),), generator=g))
        return out

    def slice_of(b, lo, hi):
        out = {}
        for f, (lens, vals) in b.items():
            start = int(lens[:lo].sum())
            out[f] = (lens[lo:hi], vals[start:start + int(lens[lo:hi].sum())])
        return out

    target = torch.linspace(-1, 1, 6 + 6 + 6 + 4)
    for step in range(steps):
        whole = batch(world * per)
        mine = slice_of(whole, rank * per, (rank + 1) * per)
        keys = ["cat", "hist", "user_id", "item_id"]  # not the tables' order
        kjt = pxt.KeyedJaggedTensor.from_lengths_sync(
            keys, torch.cat([mine[k][1] for k in keys]), torch.cat([mine[k][0] for k in keys]))
        out = ebc(kjt)
        assert out.keys() == features and out.length_per_key() == [6, 6, 6, 4]
        ((out.values() - target) ** 2).mean().backward()
        opt.zero_grad()
        pooled = []
        for f in features:
            lens, vals = whole[f]
            offsets = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)[:-1]])
            pooled.append(refs[table_of[f]](vals, offsets))
        ((torch.cat(pooled, 1) - target) ** 2).mean().backward()
        opt.step()
    ebc.synchronize()
    px.barrier(30)
    state = ebc.state_dict()
    errs = [((state[f"embedding_bags.{n}.weight"] - b.weight.data).abs() /
             b.weight.data.abs().clamp_min(1e-3)).max().item() for n, b in refs.items()]
    assert max(errs) < 1e-4, errs
    pulls = [v.stats().pull_steps for v in ebc.variables]
    pushes = [v.stats().push_steps for v in ebc.variables]
    # A feature outside its table is refused naming both.
    try:
        ebc(pxt.KeyedJaggedTensor.from_lengths_sync(
            features, torch.tensor([0, 0, 0, 30]), torch.tensor([1, 1, 1, 1])))
        raise AssertionError("an id past 'cat' was taken")
    except parallax.RowIndexError as e:
        assert "feature 'cat' has id 30, outside table 'cat' (30 rows)" in str(e), str(e)
    # EmbeddingCollection: unpooled rows, read in eval mode (no step).
    ec = pxt.EmbeddingCollection([pxt.EmbeddingConfig(20, 3, "a", ["fa", "fb"]),
                                  pxt.EmbeddingConfig(10, 3, "b", ["fc"])],
                                 name="t.ec", client=px)
    wa, wb = torch.randn(20, 3), torch.randn(10, 3)
    ec.load_state_dict({"embeddings.a.weight": wa, "embeddings.b.weight": wb})
    ec.eval()
    with torch.no_grad():
        got = ec(pxt.KeyedJaggedTensor.from_lengths_sync(
            ["fa", "fb", "fc"], torch.tensor([1, 2, 19, 9, 0]), torch.tensor([1, 0, 1, 1, 1, 1])))
    assert list(got) == ["fa", "fb", "fc"]
    assert torch.equal(got["fb"].values(), wa[[2, 19]])
    assert torch.equal(got["fc"].values(), wb[[9, 0]]) and got["fc"].lengths().tolist() == [1, 1]
    assert ec.variables[0].stats().pull_steps == 0
    emit(px, ok=True, max_rel_err=max(errs), pull_steps=pulls, push_steps=pushes)


SCENARIOS = {f.__name__: f for f in (embedding_matches_reference, embedding_bag_and_eval,
                                     sampled_softmax_matches_reference, bad_input,
                                     checkpoint_and_restore, tables_looked_up_more_than_once,
                                     collection_matches_reference)}

if __name__ == "__main__":
    torch.set_num_threads(1)
    with parallax.Client(timeout=30, op_timeout=60) as client:
        SCENARIOS[sys.argv[1]](client)
        client.barrier(60)
