#!/usr/bin/env python3
"""A recommender trained data-parallel through Parallax, checked against plain PyTorch.

The model scores a (user, item history) pair: a user embedding (parallax.torch.Embedding)
and the mean of the history's item embeddings (parallax.torch.EmbeddingBag) go through an
MLP wrapped in parallax.torch.DistributedDataParallel. Both tables live in the daemons,
which apply Adagrad to the rows a step touched; the MLP's gradients are averaged over the
workers and every worker applies the same Adam step.

The data is synthetic, from a fixed seed: every worker generates the same global batch per
step and trains on its slice. Rank 0 also trains the same model in this process with plain
PyTorch (nn.Embedding, nn.EmbeddingBag, torch.optim.Adagrad) on the whole global batch, and
at the end prints the largest relative difference between the two: float rounding only.

Start it once per worker under a launcher that sets PARALLAX_* (tools/px-cluster, torchrun
or srun), e.g. on 2 nodes x 2 workers:

    tools/px-cluster --nodes 2 --workers-per-node 2 -- python3 examples/python/recommender.py
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

import parallax
import parallax.torch as pxt

USERS, ITEMS, DIM, HISTORY = 200, 300, 8, 5
TABLE_OPTIONS = dict(optimizer="adagrad", lr=0.5, initial_accumulator=0.1, epsilon=1e-10)
MLP_LR = 0.03
TOLERANCE = 1e-4  # relative to each tensor's largest value; measured: 5e-7


def make_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2 * DIM, 32), nn.ReLU(), nn.Linear(32, 1))


def synthetic_batches(steps: int, global_batch: int):
    """(users, histories, ratings) per step: a rating is the user's hidden leniency plus
    the mean hidden quality of the items in the history, plus noise. The same on every
    worker."""
    g = torch.Generator().manual_seed(1234)
    leniency = torch.randn(USERS, generator=g)
    quality = torch.randn(ITEMS, generator=g)
    for _ in range(steps):
        users = torch.randint(0, USERS, (global_batch,), generator=g)
        histories = torch.randint(0, ITEMS, (global_batch, HISTORY), generator=g)
        ratings = (leniency[users] + quality[histories].mean(1)).unsqueeze(1)
        yield users, histories, ratings + 0.1 * torch.randn(global_batch, 1, generator=g)


class Recommender(nn.Module):
    def __init__(self, users: nn.Module, items: nn.Module, mlp: nn.Module):
        super().__init__()
        self.users, self.items, self.mlp = users, items, mlp

    def forward(self, users, histories):
        return self.mlp(torch.cat([self.users(users), self.items(histories)], dim=1))


def relative_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference, relative to the largest value of the tensor."""
    return ((got - expected).abs().max() / expected.abs().max()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64, help="samples per worker per step")
    args = parser.parse_args()
    torch.set_num_threads(1)  # several workers share this machine's cores

    client = parallax.Client()  # the job, rank and sizes from PARALLAX_*
    pxt.set_default_client(client)
    rank, workers = client.rank, client.world_size
    torch.manual_seed(0)  # the MLP's initial values, the same everywhere (DDP checks)
    # Both tables start from normal values the daemons draw (initializer "normal").
    model = Recommender(
        pxt.Embedding(USERS, DIM, name="rec.users", seed=1, **TABLE_OPTIONS),
        pxt.EmbeddingBag(ITEMS, DIM, mode="mean", name="rec.items", seed=2,
                         **TABLE_OPTIONS),
        pxt.DistributedDataParallel(make_mlp(), name="rec.mlp"))
    optimizer = torch.optim.Adam(model.mlp.parameters(), lr=MLP_LR)
    loss_var = client.dense("rec.loss", 1, np.float64, op="mean")

    if rank == 0:  # the same model in plain PyTorch, from the same initial values
        reference = Recommender(nn.Embedding(USERS, DIM),
                                nn.EmbeddingBag(ITEMS, DIM, mode="mean"), make_mlp())
        reference.users.load_state_dict(model.users.state_dict())  # reads the whole table
        reference.items.load_state_dict(model.items.state_dict())
        reference.mlp.load_state_dict(model.mlp.module.state_dict())
        reference_optimizers = [
            torch.optim.Adagrad(list(reference.users.parameters()) +
                                list(reference.items.parameters()), lr=TABLE_OPTIONS["lr"],
                                initial_accumulator_value=TABLE_OPTIONS["initial_accumulator"],
                                eps=TABLE_OPTIONS["epsilon"]),
            torch.optim.Adam(reference.mlp.parameters(), lr=MLP_LR)]
        print(f"{workers} workers on {client.world.node_count} nodes, {args.batch} samples "
              f"per worker per step", flush=True)

    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    worst_loss = 0.0
    for step, (users, histories, ratings) in enumerate(
            synthetic_batches(args.steps, workers * args.batch)):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(users[mine], histories[mine]), ratings[mine])
        loss.backward()  # pushes the tables' rows, averages the MLP's gradients
        optimizer.step()
        mean = np.array([loss.item()])
        loss_var.allreduce(mean).wait()  # the global batch's loss
        if rank == 0:
            for o in reference_optimizers:
                o.zero_grad()
            expected = nn.functional.mse_loss(reference(users, histories), ratings)
            expected.backward()
            for o in reference_optimizers:
                o.step()
            worst_loss = max(worst_loss, abs(mean[0] - expected.item()) / expected.item())
            if step % 10 == 0 or step == args.steps - 1:
                print(f"step {step:3d}  loss {mean[0]:.5f}  (reference {expected.item():.5f})",
                      flush=True)

    # Every worker's last pushes taken, then rank 0 reads the tables back (reads are not
    # steps: the other workers just wait at the barrier).
    model.users.synchronize()
    model.items.synchronize()
    client.barrier()
    worst = 0.0
    if rank == 0:
        worst = max([worst_loss,
                     relative_difference(model.users.state_dict()["weight"],
                                         reference.users.weight.data),
                     relative_difference(model.items.state_dict()["weight"],
                                         reference.items.weight.data)] +
                    [relative_difference(p.data, q.data) for p, q in
                     zip(model.mlp.module.parameters(), reference.mlp.parameters())])
        print(f"max relative difference from the single-process PyTorch reference "
              f"(losses, both tables, the MLP): {worst:.2e} (tolerance {TOLERANCE:.0e}): "
              f"{'OK' if worst <= TOLERANCE else 'TOO LARGE'}", flush=True)
    client.barrier()
    client.close()
    if worst > TOLERANCE:
        raise SystemExit(1)

if __name__ == "__main__":
    main()
