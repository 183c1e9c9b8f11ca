"""Sparse layers whose tables live in the daemons: Embedding, EmbeddingBag, SampledSoftmax.

A training forward pulls the batch's unique rows (a pull step), the layer computes on them
as an ordinary leaf tensor, and autograd's hook on that leaf pushes their gradients (a push
step) without waiting: the daemon applies the layer's optimizer on the shards, and the next
pull (step n + 1) sees every worker's push n (PX_SYNC). So each training step must end in a
backward on every worker, as with DDP; a forward under torch.no_grad() or in eval() mode
reads the rows instead (not a step) and needs no backward.

A table looked up more than once in a step (a tied or shared embedding, several features on
one table): the step lasts from its first training lookup until its gradients are pushed.
The first lookup is the pull; each later one takes the rows already pulled from them and
reads only the rows it adds (px_read_rows: one round trip, none if it adds none). Under
PX_SYNC that read sees the table after the previous step, as the pull did: the owners apply
push n only once every node sent it, and this worker's comes after its backward. Backward
gives each lookup's leaf its gradient; they are summed per row and pushed once, as soon as
every lookup's has come, or at the end of the backward for the lookups it did not reach.
A forward whose backward never came cannot be told from such a lookup until the backward:
the next training forward joins its step, the backward pushes the gradients it gives, and
the training forward after that raises InvalidArgument naming the table, the step and the
rule (eval() or torch.no_grad() for a forward without backward). Nothing is left waiting:
the step was pushed, so the other workers go on, and so can this one after the error.

Prefetch (a table with prefetch=True): module.prefetch(next_indices) after a training
forward and before its backward pulls the next forward's rows early (px_prefetch_rows), as
TorchRec's TrainPipelineSparseDist does: the rows no worker pulled in this step come while
backward runs, the others once this step's push is applied, so the next forward gets the
same rows as without it.

CUDA indices: the layers return CUDA rows and push CUDA gradients. On a table without
prefetch the steps run on device memory (px_pull_rows_ex / px_push_rows_ex with
PX_MEMORY_CUDA, on the current stream): the daemon takes device rows only inside
px_alloc_ex allocations, so each table stages its unique indices and rows in px_alloc_ex
memory of the device, kept between steps and grown as needed, and copies the rows out
(the autograd leaf) and the gradients in on the stream. A prefetch table's pulls and pushes
are checked on the host by the daemon (README, GPUs: "Not taken on device memory"): its
indices and rows go through host memory, copied on and off the device. state_dict's
weight is a host tensor either way.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

import parallax

from .session import default_client

_SPARSE_OPTIONS = ("optimizer", "lr", "beta1", "beta2", "epsilon", "initial_accumulator",
                   "initializer", "seed", "init_low", "init_high", "init_std", "aggregation",
                   "consistency", "staleness", "partitions", "route", "nonfinite",
                   "alltoall_split", "wire_dtype", "prefetch", "cache_rows", "cache_staleness",
                   "replicas")


class _Table:
    """One sparse variable and the pushes in flight on it."""

    def __init__(self, client: parallax.Client, name: str, rows: int, dim: int,
                 options: dict, register=None):
        """register(name, rows, dim, **options) -> the variable (default client.sparse;
        a collection's registers a parallax.SparseGroup)."""
        unknown = set(options) - set(_SPARSE_OPTIONS)
        if unknown:
            raise parallax.InvalidArgument(1, f"'{name}': unknown option(s) "
                                              f"{', '.join(sorted(unknown))}")
        self.client = client
        self.var = (register or client.sparse)(name, rows, dim, **options)
        self.rows, self.dim = rows, dim
        # Device steps: not on a prefetch table (the daemon checks its rows on the host).
        self.device_steps = not options.get("prefetch", False)
        self._pushes: list = []
        self._step: Optional[_StepRows] = None  # the training step pulled, not yet pushed
        self._steps = 0  # training steps begun, for messages
        # A step pushed with lookups its backward did not reach: raised at the next training
        # lookup (the rule, _push_step).
        self._misuse: Optional[str] = None
        self._stages: dict = {}  # (kind, device) -> (indices, rows) in px_alloc_ex memory

    def _stage(self, kind: str, unique: torch.Tensor):
        """(indices, rows) views of len(unique) rows in this table's px_alloc_ex staging
        memory for kind ("pull" or "push") on unique's device, unique copied in (on the
        current stream); the memory is grown to a power of two and kept."""
        n = unique.numel()
        key = (kind, unique.device)
        idx, rows = self._stages.get(key, (None, None))
        if idx is None or idx.numel() < n:
            capacity = max(1024, 1 << max(0, n - 1).bit_length())
            idx = self.client.empty_tensor(capacity, torch.int64, unique.device)
            rows = self.client.empty_tensor((capacity, self.dim), torch.float32, unique.device)
            self._stages[key] = (idx, rows)
        idx, rows = idx[:n], rows[:n]
        idx.copy_(unique)
        return idx, rows

    def _staged(self, unique: torch.Tensor) -> bool:
        """Steps on these indices run on device memory, staged in px_alloc_ex memory (CUDA
        indices, a table without prefetch); else on host memory."""
        return unique.device.type == "cuda" and self.device_steps

    def lookup(self, unique: torch.Tensor, training: bool) -> torch.Tensor:
        """The rows' values (on unique's device): a pull step when training (a read of the
        rows it adds, within a step already pulled), a read otherwise."""
        if training:
            if self._step is not None:
                return self._step.extend(unique, lambda added: self.lookup(added, False))
            if self._misuse is not None:
                why, self._misuse = self._misuse, None
                raise parallax.InvalidArgument(1, why)
            self.finish_pushes()
        op = self.var.pull if training else self.var.read
        if self._staged(unique):
            idx, rows = self._stage("pull", unique)
            op(idx, rows).wait()
            return rows.clone()  # the staging memory is the next step's
        if unique.device.type != "cpu":  # a prefetch table's CUDA rows: through the host
            return op(unique.cpu()).wait().to(unique.device)
        return op(unique).wait()

    def begin_step(self, unique: torch.Tensor, rows: torch.Tensor) -> "_StepRows":
        """Records a training step's pulled rows (its first lookup)."""
        self._steps += 1
        self._step = _StepRows(self._steps, unique, rows.detach())
        return self._step

    def gradient(self, step: "_StepRows", unique: torch.Tensor, grad: torch.Tensor) -> None:
        """One lookup's gradient (its leaf's backward hook). The step is pushed once every
        lookup's gradient has come, or at the end of this backward."""
        if step is not self._step:
            raise parallax.InvalidArgument(
                1, f"'{self.var.name}': a gradient of training step {step.number} came after "
                   "that step was pushed: every lookup of a step must be in one backward")
        step.grads.append((unique, grad.detach()))
        if len(step.grads) == step.lookups:
            self._push_step(step)
        elif not step.end_queued:
            step.end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: self._push_step(step))

    def _push_step(self, step: "_StepRows") -> None:
        if step is not self._step:
            return  # pushed already, when its last lookup's gradient came
        self._step = None
        # The step is pushed with what came, so that no other worker waits for it; a lookup
        # the backward did not reach was a training forward whose backward never came (a
        # loss logged, a metric), told at the next training forward rather than guessed
        # at this one: a second lookup of a step looks the same until its backward.
        missed = step.lookups - len(step.grads)
        if missed:
            self._misuse = (
                f"'{self.var.name}': {missed} of the {step.lookups} training-mode lookups of "
                f"training step {step.number} got no gradient from its backward (a training "
                "forward whose backward never came?); the gradients that came were pushed. "
                "Use eval() or torch.no_grad() for a forward without backward: it reads the "
                "table and takes no step")
        self.push_later(*step.summed_gradient())

    def push_later(self, unique: torch.Tensor, grad: torch.Tensor) -> None:
        """Pushes the gradient of the rows of unique without waiting (finish_pushes)."""
        grad = grad.detach().to(torch.float32)
        if self._staged(unique):
            self.finish_pushes()  # the staging memory of an earlier push is then free
            idx, rows = self._stage("push", unique)
            rows.copy_(grad)
            self._pushes.append(self.var.push(idx, rows))
        else:
            self._pushes.append(self.var.push(unique.cpu(), grad.cpu().contiguous()))

    def finish_pushes(self) -> None:
        """Waits for this worker's pushes (they only need taking, not applying)."""
        pushes, self._pushes = self._pushes, []
        parallax.wait_all(pushes)

    def read_all(self, first: int = 0, rows: Optional[int] = None,
                 chunk_rows: int = 1 << 16) -> torch.Tensor:
        """The table's rows [first, first + rows) (default: all of them), a host tensor."""
        rows = self.rows - first if rows is None else rows
        self.finish_pushes()
        out = torch.empty((rows, self.dim), dtype=torch.float32)
        for start in range(0, rows, chunk_rows):
            idx = torch.arange(first + start, first + min(rows, start + chunk_rows),
                               dtype=torch.int64)
            self.var.read(idx, out[start:start + len(idx)]).wait()
        return out

    def load_all(self, values: torch.Tensor, first: int = 0, rows: Optional[int] = None,
                 what: Optional[str] = None, chunk_rows: int = 1 << 16) -> None:
        """Loads values into rows [first, first + rows) (default: the whole table)."""
        rows = self.rows - first if rows is None else rows
        if tuple(values.shape) != (rows, self.dim):
            raise parallax.InvalidArgument(
                1, f"'{what or self.var.name}': loading a {tuple(values.shape)} tensor into a "
                   f"{rows} x {self.dim} table")
        self.finish_pushes()
        # Through host memory, whatever device the values are on (a CUDA checkpoint).
        values = values.detach().to("cpu", torch.float32).contiguous()
        for start in range(0, rows, chunk_rows):
            idx = torch.arange(first + start, first + min(rows, start + chunk_rows),
                               dtype=torch.int64)
            self.var.load(idx, values[start:start + len(idx)]).wait()


class _StepRows:
    """A training step of one table between its pull and its push: the rows its lookups
    took (sorted unique indices, detached values) and the gradients backward gave them."""

    def __init__(self, number: int, index: torch.Tensor, values: torch.Tensor):
        self.number = number
        self.index, self.values = index, values
        self.lookups = 1
        self.grads: list = []  # (unique indices, their gradient rows), one per lookup reached
        self.end_queued = False  # the push at the end of the backward is queued

    def _positions(self, unique: torch.Tensor):
        """Where each of unique's indices is in self.index, and which are there."""
        pos = torch.searchsorted(self.index, unique).clamp_(max=max(0, self.index.numel() - 1))
        if self.index.numel() == 0:
            return pos, torch.zeros_like(unique, dtype=torch.bool)
        return pos, self.index[pos] == unique

    def extend(self, unique: torch.Tensor, read) -> torch.Tensor:
        """A later lookup's rows (on unique's device): those the step has, and the others
        read (read(indices) -> rows) and added to it."""
        device = unique.device
        unique = unique.to(self.index.device)
        pos, present = self._positions(unique)
        if not bool(present.all()):
            missing = unique[~present]
            index = torch.cat([self.index, missing])
            values = torch.cat([self.values, read(missing).to(self.values.device)])
            index, order = torch.sort(index)
            self.index, self.values = index, values[order]
            pos, _ = self._positions(unique)
        self.lookups += 1
        return self.values[pos].to(device)

    def summed_gradient(self):
        """(unique indices, gradient rows): every gradient that came, summed per row."""
        if len(self.grads) == 1:
            return self.grads[0]
        device = self.grads[0][1].device
        index = torch.cat([u.to(device) for u, _ in self.grads])
        grads = torch.cat([g.to(device, torch.float32) for _, g in self.grads])
        unique, inverse = torch.unique(index, return_inverse=True)
        summed = torch.zeros((unique.numel(), grads.shape[1]), dtype=torch.float32,
                             device=device)
        summed.index_add_(0, inverse, grads)
        return unique, summed


def _padding_index(padding_idx: Optional[int], rows: int, name: str) -> Optional[int]:
    """padding_idx as torch takes it (negative counts from the end), as a row index."""
    if padding_idx is None:
        return None
    if not -rows <= padding_idx < rows:
        raise parallax.InvalidArgument(1, f"'{name}': padding_idx {padding_idx} is outside "
                                          f"the table's {rows} rows")
    return padding_idx + rows if padding_idx < 0 else padding_idx


def _unique(indices: torch.Tensor, rows: int, name: str):
    """(sorted unique indices as int64, inverse index), on the indices' device."""
    if indices.dtype.is_floating_point:
        raise parallax.InvalidArgument(1, f"'{name}': indices must be integers, "
                                          f"not {indices.dtype}")
    if indices.device.type not in ("cpu", "cuda"):
        raise parallax.InvalidArgument(1, f"'{name}': indices are on {indices.device}; "
                                          "Parallax takes indices in host memory or on a "
                                          "CUDA device")
    return torch.unique(indices.reshape(-1).to(torch.int64), return_inverse=True)


class _SparseModule(nn.Module):
    def __init__(self, rows: int, dim: int, name: str, client: Optional[parallax.Client],
                 options: dict, padding_idx: Optional[int] = None):
        super().__init__()
        self.table_name = name
        # options["_table"]: another layer's, for layers sharing one weight (parallelize()).
        shared = options.pop("_table", None)
        self._table = shared or _Table(client or default_client(), name, rows, dim, options)
        self.padding_idx = _padding_index(padding_idx, rows, name)
        self._ahead = None  # (indices, unique, inverse, request) of a prefetch
        if shared is None:
            self._zero_padding_row()

    def _zero_padding_row(self) -> None:
        """Loads zeros into the padding row, as nn.Embedding initialises it. Every worker
        loads the same zeros, and no push changes the row (its gradients are dropped)."""
        if self.padding_idx is not None:
            idx = torch.tensor([self.padding_idx], dtype=torch.int64)
            self._table.var.load(idx, torch.zeros((1, self._table.dim))).wait()

    def prefetch(self, indices: torch.Tensor) -> None:
        """Pulls the rows of the next training forward now (its pull step, issued ahead):
        call it after this step's forward, before its backward. The table needs
        prefetch=True, and the next training forward must look up exactly these indices."""
        if self._ahead is not None:
            raise parallax.InvalidArgument(1, f"'{self.table_name}': a prefetch is already "
                                              "waiting for its forward")
        unique, inverse = _unique(indices, self._table.rows, self.table_name)
        # Prefetch pulls go through host memory (the daemon checks their rows there).
        request = self._table.var.prefetch(unique.cpu())
        self._ahead = (indices.detach().clone(), unique, inverse, request)

    def _lookup(self, indices: torch.Tensor, training: bool):
        # A later lookup of a step already pulled extends it, prefetched rows or not (they
        # are the next step's).
        if training and self._ahead is not None and self._table._step is None:
            expected, unique, inverse, request = self._ahead
            self._ahead = None
            if expected.shape != indices.shape or not torch.equal(
                    expected.to(torch.int64), indices.to(torch.int64)):
                request.wait()
                raise parallax.InvalidArgument(
                    1, f"'{self.table_name}': the forward's indices are not the ones "
                       "prefetched for it")
            self._table.finish_pushes()
            return request.wait().to(unique.device), unique, inverse
        unique, inverse = _unique(indices, self._table.rows, self.table_name)
        return self._table.lookup(unique, training), unique, inverse

    def _rows(self, indices: torch.Tensor):
        """(unique rows as a leaf tensor, inverse index, the padding row's place among the
        rows or None); the leaf's gradient is pushed with the step's (module docstring: a
        table looked up more than once in a step), the padding row's left out."""
        training = self.training and torch.is_grad_enabled()
        table = self._table
        step = table._step if training else None
        rows, unique, inverse = self._lookup(indices, training)
        pad = None
        if self.padding_idx is not None:
            at = int(torch.searchsorted(unique, self.padding_idx))
            if at < unique.numel() and int(unique[at]) == self.padding_idx:
                pad = at
        if training:
            if step is None:
                step = table.begin_step(unique, rows)
            rows.requires_grad_(True)
            if pad is None:
                rows.register_hook(lambda grad: table.gradient(step, unique, grad))
            else:
                keep = unique != self.padding_idx
                rows.register_hook(lambda grad: table.gradient(step, unique[keep], grad[keep]))
        return rows, inverse.reshape(indices.shape), pad

    def synchronize(self) -> None:
        """Waits for the pushes this worker has in flight (before a checkpoint, say)."""
        self._table.finish_pushes()

    @property
    def lr(self) -> float:
        """The table's learning rate for the next training step. Set it between steps
        (px_set_sparse_lr: from this worker's next push on), the same on every worker, as
        a scheduler does; parallelize() follows the optimizer's param group by itself."""
        return self._table.var.learning_rate

    @lr.setter
    def lr(self, rate: float) -> None:
        self._table.var.learning_rate = rate

    @property
    def variable(self) -> parallax.SparseVariable:
        return self._table.var

    # state_dict through px_read_rows / px_load_rows: the whole table, as nn.Embedding's.
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self._table.read_all()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "weight"
        if key in state_dict:
            self._table.load_all(state_dict[key])
        elif strict:
            missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, False, [],
                                      unexpected_keys, error_msgs)


class Embedding(_SparseModule):
    """A drop-in for nn.Embedding(num_embeddings, embedding_dim) whose table lives in the
    daemons. optimizer (default "adagrad") and its hyper-parameters (lr, epsilon,
    initial_accumulator, beta1, beta2), initializer ("normal" with init_std, "uniform",
    "zeros"; seed), route ("hybrid": auto for sync tables; "ps", "allgatherv",
    "allreduce", "auto", "alltoall" with
    alltoall_split "rows" or "columns"), consistency
    ("sync", "async", "bounded" + staleness) and aggregation ("mean": the gradient of the
    global batch's mean loss, as DDP averages; "sum") are options of the table (see
    parallax.SparseVariable). name must be the same on every worker and unique in the job.
    Indices may be on the host or on a CUDA device; the rows come back on theirs (module
    docstring: device steps, or through the host for a prefetch table). padding_idx as
    nn.Embedding's: its row is loaded with zeros at construction (by every worker) and
    gets no gradient, so no push changes it.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, name: str,
                 client: Optional[parallax.Client] = None, optimizer: str = "adagrad",
                 lr: float = 0.1, aggregation: str = "mean", initializer: str = "normal",
                 init_std: float = 1.0, padding_idx: Optional[int] = None, **options: Any):
        options.update(optimizer=optimizer, lr=lr, aggregation=aggregation,
                       initializer=initializer, init_std=init_std)
        super().__init__(num_embeddings, embedding_dim, name, client, options, padding_idx)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        rows, inverse, pad = self._rows(indices)
        return F.embedding(inverse, rows, padding_idx=pad)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}, table='{self.table_name}'"


class EmbeddingBag(_SparseModule):
    """A drop-in for nn.EmbeddingBag (mode "sum", "mean" or "max"; offsets or 2-D input;
    per_sample_weights with "sum"; include_last_offset; padding_idx, whose entries are left
    out of their bags, as Embedding's) over a table in the daemons; options as Embedding."""

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "mean", *,
                 name: str, client: Optional[parallax.Client] = None,
                 optimizer: str = "adagrad", lr: float = 0.1, aggregation: str = "mean",
                 initializer: str = "normal", init_std: float = 1.0,
                 include_last_offset: bool = False, padding_idx: Optional[int] = None,
                 **options: Any):
        options.update(optimizer=optimizer, lr=lr, aggregation=aggregation,
                       initializer=initializer, init_std=init_std)
        super().__init__(num_embeddings, embedding_dim, name, client, options, padding_idx)
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.include_last_offset = include_last_offset

    def forward(self, indices: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows, inverse, pad = self._rows(indices)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=pad)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode='{self.mode}'{pad}, "
                f"table='{self.table_name}'")


class LogUniformSampler:
    """Draws num_sampled distinct classes from P(c) = log((c+2)/(c+1)) / log(V+1), the
    Zipfian sampler of TensorFlow's sampled softmax (classes sorted by frequency). The
    generator is seeded per step, so every worker draws the same classes for a step."""

    def __init__(self, num_classes: int, seed: int = 0):
        self.num_classes = num_classes
        self.seed = seed
        c = torch.arange(num_classes, dtype=torch.float64)
        self.log_range = math.log(num_classes + 1)
        self.prob = (torch.log((c + 2) / (c + 1)) / self.log_range)

    def sample(self, num_sampled: int, step: int) -> torch.Tensor:
        """The step's num_sampled distinct classes (a host tensor, the same on every
        worker: the generator is seeded with (seed, step))."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.multinomial(self.prob.float(), num_sampled, replacement=False,
                                 generator=g)

    def expected_count(self, classes: torch.Tensor, num_sampled: int) -> torch.Tensor:
        """How often each class is expected in a sample (on the classes' device)."""
        # Sampling without replacement: P(c in sample) ~ 1 - (1 - p)^num_sampled (TF's).
        p = self.prob[classes.cpu()].to(classes.device)
        return -torch.expm1(num_sampled * torch.log1p(-p))


def sampled_softmax_loss(hidden: torch.Tensor, targets: torch.Tensor, sampled: torch.Tensor,
                         w_true: torch.Tensor, w_sampled: torch.Tensor,
                         sampler: LogUniformSampler) -> torch.Tensor:
    """TensorFlow's sampled_softmax_loss (mean over the batch): hidden B x dim, targets B,
    sampled S shared negatives; w_true B x (dim + 1) and w_sampled S x (dim + 1) are the
    targets' and the samples' weight rows, bias last. A dense reference model calls it with
    rows indexed from an ordinary table."""
    num_sampled = sampled.shape[0]
    true_logits = (hidden * w_true[:, :-1]).sum(-1) + w_true[:, -1]
    sampled_logits = hidden @ w_sampled[:, :-1].t() + w_sampled[:, -1]
    true_logits = true_logits - torch.log(sampler.expected_count(targets, num_sampled)).float()
    sampled_logits = sampled_logits - torch.log(
        sampler.expected_count(sampled, num_sampled)).float()
    hits = targets[:, None] == sampled[None, :]  # accidental hits are not negatives
    sampled_logits = sampled_logits.masked_fill(hits, float("-inf"))
    logits = torch.cat([true_logits[:, None], sampled_logits], dim=1)
    return F.cross_entropy(logits, torch.zeros(targets.shape[0], dtype=torch.int64,
                                               device=logits.device))


class SampledSoftmax(_SparseModule):
    """A softmax output layer over num_classes whose weights (and biases, the last column)
    are a sparse table: training computes TensorFlow's sampled_softmax_loss — each
    example's true class against num_sampled shared negatives from a log-uniform sampler,
    logits corrected by log expected count, accidental hits removed — pulling only the
    rows of the batch's targets and the sampled classes. full_log_probs() gives the exact
    softmax (reads the whole table) for evaluation. The sample of a step is a function of
    (seed, step), so every worker draws the same one, as does a single-process reference.
    """

    def __init__(self, num_classes: int, dim: int, num_sampled: int, *, name: str,
                 client: Optional[parallax.Client] = None, optimizer: str = "adagrad",
                 lr: float = 0.1, aggregation: str = "mean", initializer: str = "uniform",
                 sampler_seed: int = 0, **options: Any):
        bound = 1.0 / math.sqrt(dim)
        options.setdefault("init_low", -bound)
        options.setdefault("init_high", bound)
        options.update(optimizer=optimizer, lr=lr, aggregation=aggregation,
                       initializer=initializer)
        super().__init__(num_classes, dim + 1, name, client, options)
        self.num_classes, self.dim, self.num_sampled = num_classes, dim, num_sampled
        self.sampler = LogUniformSampler(num_classes, sampler_seed)
        self.step = 0

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean sampled-softmax loss of hidden (B x dim) against targets (B)."""
        targets = targets.reshape(-1).to(torch.int64)
        hidden = hidden.reshape(-1, self.dim)
        if hidden.shape[0] != targets.shape[0]:
            raise parallax.InvalidArgument(1, f"'{self.table_name}': {hidden.shape[0]} hidden "
                                              f"rows for {targets.shape[0]} targets")
        sampled = self.sampler.sample(self.num_sampled, self.step).to(targets.device)
        self.step += 1
        rows, inverse, _ = self._rows(torch.cat([targets, sampled]))
        b = targets.shape[0]
        return sampled_softmax_loss(hidden, targets, sampled, rows[inverse[:b]],
                                    rows[inverse[b:]], self.sampler)

    def prefetch(self, targets: torch.Tensor) -> None:
        """The next training forward's rows (its targets and the sample of its step)."""
        sampled = self.sampler.sample(self.num_sampled, self.step).to(targets.device)
        super().prefetch(torch.cat([targets.reshape(-1).to(torch.int64), sampled]))

    def full_log_probs(self, hidden: torch.Tensor,
                       table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log softmax over every class (B x num_classes). table: the whole table, as
        state_dict()["weight"] gives it (read once and pass it when scoring many batches);
        None reads it now."""
        table = self._table.read_all() if table is None else table
        table = table.to(hidden.device)  # read_all is a host tensor; hidden may be on CUDA
        return F.log_softmax(hidden.reshape(-1, self.dim) @ table[:, :-1].t() + table[:, -1],
                             dim=-1)

    def extra_repr(self) -> str:
        return (f"{self.num_classes}, {self.dim}, num_sampled={self.num_sampled}, "
                f"table='{self.table_name}'")
