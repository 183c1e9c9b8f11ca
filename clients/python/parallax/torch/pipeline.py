"""TrainPipeline: drives the data loader one batch ahead and prefetches the next batch's
sparse rows while this batch's backward runs, as TorchRec's TrainPipelineSparseDist does.

    pipeline = pxt.TrainPipeline(model, [optimizer])
    it = iter(loader)
    while True:
        try:
            loss = pipeline.progress(it)
        except StopIteration:
            break

Each progress() trains on one batch: it takes the following batch from the iterator,
runs the forward on the current one, calls prefetch(following) (each sparse layer's
px_prefetch_rows: rows no worker touches in this step come at once, the others once this
step's push is applied, so PX_SYNC results are exactly those without the pipeline), then
backward and the optimizers' step. The sparse layers need prefetch=True.

CUDA batches work as host ones (the layers take CUDA indices; a prefetch table's rows go
through host memory). With device=, each batch's tensors are moved there as the batch is
taken from the iterator, one step ahead (non_blocking: from pinned memory the copy
overlaps this step's work), as TorchRec's pipeline copies its next batch to the GPU.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional

import torch

import parallax

_END = object()


def _to_device(batch: Any, device: Optional[torch.device]) -> Any:
    """batch with every tensor in it (in tuples, lists and dicts, nested) on device."""
    if device is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_to_device(x, device) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(x, device) for x in batch)
    if isinstance(batch, dict):
        return type(batch)((k, _to_device(v, device)) for k, v in batch.items())
    return batch


def _loss_of(result: Any) -> torch.Tensor:
    loss = result[0] if isinstance(result, (tuple, list)) else result
    if not isinstance(loss, torch.Tensor):
        raise parallax.InvalidArgument(
            1, f"TrainPipeline: the forward returned {type(loss).__name__}; a loss tensor or "
               "(loss, ...) is needed")
    return loss


class TrainPipeline:
    """model: the module trained; optimizers: the dense optimizers stepped after backward
    (the sparse layers' optimizers run in the daemons; [] for none). forward(model, batch)
    returns the loss or (loss, output, ...) (default model(batch)); prefetch(batch) issues
    the sparse layers' prefetches for a batch (default model.prefetch(batch), looked up
    through a DistributedDataParallel wrapper's .module). device: where each batch's
    tensors are moved when the batch is taken from the iterator, one step ahead (None:
    left where the loader put them). Every worker runs the same number of progress()
    calls, as without the pipeline (each is a step of every sparse table)."""

    def __init__(self, model: torch.nn.Module,
                 optimizers: Iterable[torch.optim.Optimizer] = (), *,
                 forward: Optional[Callable[[torch.nn.Module, Any], Any]] = None,
                 prefetch: Optional[Callable[[Any], None]] = None,
                 device: Any = None):
        if isinstance(optimizers, torch.optim.Optimizer):
            optimizers = [optimizers]
        self.model = model
        self.optimizers = list(optimizers)
        self._forward = forward or (lambda m, batch: m(batch))
        if prefetch is None:
            inner = getattr(model, "module", model)
            prefetch = getattr(inner, "prefetch", None) or getattr(model, "prefetch", None)
            if prefetch is None:
                raise parallax.InvalidArgument(
                    1, f"TrainPipeline: {type(inner).__name__} has no prefetch(batch); pass "
                       "prefetch=, a function that calls each sparse layer's prefetch")
        self._prefetch = prefetch
        self.device = None if device is None else torch.device(device)
        self._following: Any = _END  # the batch taken ahead, whose rows may be in flight
        self.steps = 0

    def progress(self, batches: Iterator[Any]) -> Any:
        """Trains on the next batch and returns what the forward returned. StopIteration
        when the iterator is exhausted (nothing is then in flight; a new iterator goes on).
        In eval mode (or under no_grad) it only runs the forward: no step, no prefetch."""
        if self._following is _END:
            # StopIteration: nothing taken, nothing pending
            self._following = _to_device(next(batches), self.device)
        batch = self._following
        following = next(batches, _END)
        self._following = following if following is _END else _to_device(following,
                                                                          self.device)
        training = self.model.training and torch.is_grad_enabled()
        if not training:
            return self._forward(self.model, batch)
        for optimizer in self.optimizers:
            optimizer.zero_grad()
        result = self._forward(self.model, batch)
        loss = _loss_of(result)
        failed: Optional[BaseException] = None
        if self._following is not _END:
            try:
                self._prefetch(self._following)
            except Exception as error:  # noqa: BLE001 - re-raised once this step is complete
                # This step is already a pull step of every table: finish it (backward, push,
                # optimizer) so the other workers are not left waiting, then report. The
                # failed batch stays next: layers that took its prefetch expect it, and its
                # forward raises the same error for the layers that refused it.
                failed = error
        loss.backward()
        for optimizer in self.optimizers:
            optimizer.step()
        self.steps += 1
        if failed is not None:
            raise failed
        return result
