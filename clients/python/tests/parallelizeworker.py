"""Worker scenarios for parallax.torch.parallelize(): `parallelizeworker.py SCENARIO`.

recommender KIND: an unmodified single-process recommender (two nn.EmbeddingBag tables,
one of them with padding_idx, the other looked up by two features, and an MLP)
parallelized, each worker training on its slice of the global batch, checked against the
same model and optimizer trained in this process on the whole batch. KIND: adagrad (one
Adagrad), sparseadam (SparseAdam + Adam), scheduled (Adagrad under a LambdaLR schedule).
refusals: what parallelize() refuses, warns about, or leaves dense.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn

import parallax
import parallax.torch as pxt
from pyworker import emit

USERS, ITEMS, DIM, PER_WORKER, STEPS = 40, 60, 8, 6, 5


class Recommender(nn.Module):
    """User features (a multi-hot bag, 0 = none) and the item history (a bag) and the
    candidate item, both from the item table, into an MLP scoring a click."""

    def __init__(self, sparse: bool):
        super().__init__()
        torch.manual_seed(7)
        self.users = nn.EmbeddingBag(USERS, DIM, mode="sum", padding_idx=0, sparse=sparse)
        self.items = nn.EmbeddingBag(ITEMS, DIM, mode="mean", sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(3 * DIM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user, user_offsets, history, history_offsets, candidate):
        u = self.users(user, user_offsets)
        h = self.items(history, history_offsets)
        c = self.items(candidate, torch.arange(candidate.numel()))
        return self.mlp(torch.cat([u, h, c], dim=1)).squeeze(1)


def _optimizers(model: Recommender, kind: str):
    if kind in ("adagrad", "scheduled"):  # one optimizer, the tables' mapped to adagrad
        return torch.optim.Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=0.1,
                                   eps=1e-10)
    tables = [model.users.weight, model.items.weight]
    return [torch.optim.SparseAdam(tables, lr=0.05, betas=(0.8, 0.95), eps=1e-7),
            torch.optim.Adam(model.mlp.parameters(), lr=0.01)]


def _samples(world_size: int):
    """Each step's global batch: a list of (user ids, history ids, candidate, label)."""
    g = torch.Generator().manual_seed(99)
    for _ in range(STEPS):
        batch = []
        for _ in range(world_size * PER_WORKER):
            user = torch.randint(0, USERS, (int(torch.randint(1, 4, (1,), generator=g)),),
                                 generator=g)
            history = torch.randint(0, ITEMS, (int(torch.randint(1, 5, (1,), generator=g)),),
                                    generator=g)
            candidate = int(torch.randint(0, ITEMS, (1,), generator=g))
            batch.append((user, history, candidate, float(candidate % 2)))
        yield batch


def _inputs(samples):
    def bags(lists):
        offsets = torch.tensor([0] + [len(x) for x in lists[:-1]]).cumsum(0)
        return torch.cat(lists), offsets
    user, user_offsets = bags([s[0] for s in samples])
    history, history_offsets = bags([s[1] for s in samples])
    candidate = torch.tensor([s[2] for s in samples])
    labels = torch.tensor([s[3] for s in samples])
    return (user, user_offsets, history, history_offsets, candidate), labels


def _schedulers(optimizers, kind: str):
    """scheduled: a warm-up over 3 steps, then halving each step (LambdaLR)."""
    if kind != "scheduled":
        return []
    return [torch.optim.lr_scheduler.LambdaLR(
        o, lambda s: (s + 1) / 3 if s < 3 else 0.5 ** (s - 2)) for o in optimizers]


def _train_step(model, optimizers, samples):
    inputs, labels = _inputs(samples)
    for o in optimizers:
        o.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(model(*inputs), labels)
    loss.backward()
    for o in optimizers:
        o.step()
    return loss.item()


def recommender(px):
    kind = sys.argv[2]
    sparse = kind == "sparseadam"
    reference = Recommender(sparse)
    ref_opts = _optimizers(reference, kind)
    ref_opts = ref_opts if isinstance(ref_opts, list) else [ref_opts]
    expected_keys = list(Recommender(sparse).state_dict())
    model = Recommender(sparse)
    optimizer = _optimizers(model, kind)
    model, optimizer = pxt.parallelize(model, optimizer, client=px, name=f"rec.{kind}")
    opts = optimizer if isinstance(optimizer, list) else [optimizer]
    plan = pxt.plan(model)
    assert sorted(plan.tables) == ["items", "users"], plan.tables
    assert plan.dense == [n for n, _ in model.named_parameters()] and len(plan.dense) == 4
    assert isinstance(model.users, pxt.EmbeddingBag) and model.users.padding_idx == 0
    assert all(p.dim() != 2 or p.shape[1] != DIM or p.shape[0] not in (USERS, ITEMS)
               for o in opts for g in o.param_groups for p in g["params"])
    rank, world = px.rank, px.world_size
    schedulers, ref_schedulers = _schedulers(opts, kind), _schedulers(ref_opts, kind)
    losses = []
    for step, samples in enumerate(_samples(world)):
        mine = samples[rank * PER_WORKER:(rank + 1) * PER_WORKER]
        losses.append(_train_step(model, opts, mine))
        _train_step(reference, ref_opts, samples)
        for s in schedulers + ref_schedulers:
            s.step()
        if schedulers and step == 1:  # a resume: new param-group dicts, still followed
            for o in opts + ref_opts:
                o.load_state_dict(o.state_dict())
    if schedulers:  # the tables followed their group's lr, as of the last forward (f(4))
        assert abs(plan.tables["items"].lr - 0.2 * 0.25) < 1e-12, plan.tables["items"].lr
    for layer in plan.tables.values():
        layer.synchronize()
    px.barrier(30)
    state = model.state_dict()
    assert list(state) == expected_keys, (list(state), expected_keys)
    errs = {}
    for key, ref in reference.state_dict().items():
        got = state[key]
        errs[key] = ((got - ref).abs() / ref.abs().clamp_min(1e-3)).max().item()
    assert max(errs.values()) < 1e-4, errs
    # The padding row got no gradient: still the zeros nn.EmbeddingBag starts it with.
    assert float(state["users.weight"][0].abs().sum()) == 0.0
    # Evaluation reads the tables, as the reference computes.
    model.eval()
    reference.eval()
    inputs, _ = _inputs(next(iter(_samples(world))))
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), reference(*inputs), rtol=1e-4, atol=1e-5)
    stats = plan.tables["items"].variable.stats()
    emit(px, ok=True, max_rel_err=max(errs.values()), losses=losses,
         items_pull_steps=stats.pull_steps, items_push_steps=stats.push_steps)


class _Scaled(nn.Embedding):
    """A subclass with its own forward (scaled by sqrt(dim), as Transformers do)."""

    def forward(self, x):
        return super().forward(x) * self.embedding_dim ** 0.5


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(self.embed(x))


def refusals(px):
    seen = {}

    def refused(key, make_model, make_optimizer, **kw):
        model = make_model()
        try:
            pxt.parallelize(model, make_optimizer(model), client=px, name=f"refused.{key}",
                            **kw)
        except parallax.InvalidArgument as e:
            seen[key] = str(e)
            return
        raise AssertionError(f"{key}: parallelize() accepted it")

    def embedding(**kw):
        return lambda: nn.Sequential(nn.Embedding(10, 4, **kw), nn.Linear(4, 1))

    refused("momentum", embedding(), lambda m: torch.optim.SGD(m.parameters(), lr=0.1,
                                                               momentum=0.9))
    refused("rmsprop", embedding(), lambda m: torch.optim.RMSprop(m.parameters()))
    refused("max_norm", embedding(max_norm=1.0), lambda m: torch.optim.SGD(m.parameters(),
                                                                           lr=0.1))
    refused("not_trained", embedding(), lambda m: torch.optim.SGD(m[1].parameters(), lr=0.1))
    refused("unknown_table", embedding(), lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
            tables={"nope": {"route": "ps"}})
    refused("table_lr", embedding(), lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
            tables={"0": {"lr": 0.5}})
    refused("subclass", lambda: nn.Sequential(_Scaled(10, 4), nn.Linear(4, 1)),
            lambda m: torch.optim.SGD(m.parameters(), lr=0.1))

    # Tied with a Linear: kept dense, with a warning; a frozen table is left as it is.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tied = _Tied()
        tied, _ = pxt.parallelize(tied, torch.optim.SGD(tied.parameters(), lr=0.1),
                                  client=px, name="tied")
    assert any("'embed' shares its weight with 'out'" in str(w.message) for w in caught)
    assert isinstance(tied.embed, nn.Embedding) and not pxt.plan(tied).tables
    frozen = nn.Sequential(nn.Embedding(10, 4).requires_grad_(False), nn.Linear(4, 1))
    frozen, _ = pxt.parallelize(frozen, torch.optim.SGD(frozen[1].parameters(), lr=0.1),
                                client=px, name="frozen")
    assert isinstance(frozen[0], nn.Embedding) and not pxt.plan(frozen).tables

    # torch.optim.Adam on a table: mapped to the daemons' lazy Adam, said in a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lazy = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
        pxt.parallelize(lazy, torch.optim.Adam(lazy.parameters()), client=px, name="lazy")
    seen["adam"] = " ".join(str(w.message) for w in caught)

    emit(px, ok=True, seen=seen)


SCENARIOS = {f.__name__: f for f in (recommender, refusals)}

if __name__ == "__main__":
    torch.set_num_threads(1)
    with parallax.Client(timeout=30, op_timeout=60) as client:
        SCENARIOS[sys.argv[1]](client)
        client.barrier(60)
