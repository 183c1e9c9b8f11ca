"""The word-level language model of the demo, the equivalence test and the LM benchmark.

LM1B's shape, small: a sparse input embedding, an LSTM, a projection, and a sampled-
softmax output whose weight table is sparse too. Through Parallax the two tables live in
the daemons (parallax.torch.Embedding / SampledSoftmax); `ReferenceLM` is the same model
in plain PyTorch (nn.Embedding, an ordinary output table, torch.optim.Adagrad on both), the
single-process baseline of the equivalence test, and the model train.py --parallelize
hands to parallax.torch.parallelize() as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import parallax.torch as pxt


@dataclass
class LMConfig:
    vocab: int
    embed: int = 64
    hidden: int = 128
    num_sampled: int = 256
    table_lr: float = 0.1        # Adagrad on both tables (LM1B's choice for its embeddings)
    dense_lr: float = 2e-3       # Adam on the dense layers
    seed: int = 0
    route: str = "hybrid"
    wire_dtype: str = "f32"      # both tables' rows and gradients between nodes (lossy: bf16, f16)
    prefetch: bool = False       # tables that take the next step's pull early (prefetch())
    consistency: str = "sync"    # both tables' ("bounded": pulls may lag `staleness` steps)
    staleness: int = 0
    cache_rows: int = 0          # a hot-row cache per node (bounded tables; 0: none)
    cache_staleness: int = 0
    replicas: int = 1  # 2: each node keeps a copy of another's partitions (elastic runs)


class Body(nn.Module):
    """The dense layers: embedding vectors in, softmax inputs out."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.rnn = nn.LSTM(cfg.embed, cfg.hidden, batch_first=True)
        self.proj = nn.Linear(cfg.hidden, cfg.embed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.rnn(x)[0])


def initial_tables(cfg: LMConfig):
    """The tables' initial values, from cfg.seed: N(0, 1) embeddings (nn.Embedding's) and
    U(+-1/sqrt(embed)) softmax weights and biases."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    embedding = torch.randn(cfg.vocab, cfg.embed, generator=g)
    bound = cfg.embed ** -0.5
    softmax = (torch.rand(cfg.vocab, cfg.embed + 1, generator=g) * 2 - 1) * bound
    return embedding, softmax


def _table_options(cfg: LMConfig) -> dict:
    # Adagrad as torch.optim.Adagrad(initial_accumulator_value=0.1, eps=1e-10) runs it;
    # "mean" makes the push the gradient of the global batch's mean loss, as DDP's average.
    return dict(optimizer="adagrad", lr=cfg.table_lr, initial_accumulator=0.1, epsilon=1e-10,
                aggregation="mean", route=cfg.route, wire_dtype=cfg.wire_dtype,
                prefetch=cfg.prefetch, replicas=cfg.replicas, **consistency_options(cfg))


def consistency_options(cfg: LMConfig) -> dict:
    return dict(consistency=cfg.consistency, staleness=cfg.staleness, cache_rows=cfg.cache_rows,
                cache_staleness=cfg.cache_staleness)


class ParallaxLM(nn.Module):
    """The model with both tables in the daemons. Every worker builds it identically."""

    def __init__(self, cfg: LMConfig, client, load_initial: bool = True):
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.body = Body(cfg)
        opts = _table_options(cfg)
        self.embedding = pxt.Embedding(cfg.vocab, cfg.embed, name="lm.embedding",
                                       client=client, **opts)
        self.softmax = pxt.SampledSoftmax(cfg.vocab, cfg.embed, cfg.num_sampled,
                                          name="lm.softmax", client=client,
                                          sampler_seed=cfg.seed, **opts)
        if load_initial:
            # One worker loads, everyone waits: loads are not steps (px_load_rows).
            if client.rank == 0:
                embedding, softmax = initial_tables(cfg)
                self.embedding.load_state_dict({"weight": embedding})
                self.softmax.load_state_dict({"weight": softmax})
            client.barrier()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.body(self.embedding(x)), y)

    def prefetch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The next step's rows of both tables, pulled now (cfg.prefetch): call it after a
        training forward, before its backward, with the next step's batch."""
        self.embedding.prefetch(x)
        self.softmax.prefetch(y)

    def log_probs(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Exact log-probabilities of every word after each position; table: the softmax
        table (self.softmax.state_dict()["weight"], read once per evaluation)."""
        return self.softmax.full_log_probs(self.body(self.embedding(x)), table)


class ReferenceLM(nn.Module):
    """The same model in one process of plain PyTorch: the equivalence test's baseline and
    the peers' model in the LM benchmark. sparse_grads makes both tables produce sparse
    gradients (nn.Embedding(sparse=True)); otherwise they are dense, whole-table."""

    def __init__(self, cfg: LMConfig, sparse_grads: bool = False):
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.body = Body(cfg)
        embedding, softmax = initial_tables(cfg)
        self.embedding = nn.Embedding.from_pretrained(embedding, freeze=False,
                                                      sparse=sparse_grads)
        self.softmax_table = nn.Embedding.from_pretrained(softmax, freeze=False,
                                                          sparse=sparse_grads)
        self.sampler = pxt.LogUniformSampler(cfg.vocab, cfg.seed)
        self.step = 0

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = self.body(self.embedding(x)).reshape(-1, self.cfg.embed)
        targets = y.reshape(-1)
        sampled = self.sampler.sample(self.cfg.num_sampled, self.step)
        self.step += 1
        return pxt.sampled_softmax_loss(hidden, targets, sampled, self.softmax_table(targets),
                                        self.softmax_table(sampled), self.sampler)

    def log_probs(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """As ParallaxLM.log_probs; table: the softmax table's weight."""
        hidden = self.body(self.embedding(x)).reshape(-1, self.cfg.embed)
        return torch.log_softmax(hidden @ table[:, :-1].t() + table[:, -1], dim=-1)

    def tables(self) -> list:
        return [self.embedding.weight, self.softmax_table.weight]

    def optimizers(self):
        return [torch.optim.Adam(self.body.parameters(), lr=self.cfg.dense_lr),
                torch.optim.Adagrad(self.tables(), lr=self.cfg.table_lr,
                                    initial_accumulator_value=0.1, eps=1e-10)]
