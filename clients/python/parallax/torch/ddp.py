"""The dense half of parallax.torch: a DDP-style wrapper, a Horovod-style optimizer, and
broadcasts of parameters and optimizer state. Gradients are views into flat arena buckets
(DDP's gradient_as_bucket_view), each allreduced in place (mean over every worker) the
moment its last gradient is ready, while the rest of backward runs: nothing is copied.

Each bucket is its own Parallax dense variable, and a variable's n-th allreduce is its step
n on every worker: buckets may therefore be submitted and complete in any order on
different workers (a parameter unused on one worker, a different hook order) without
deadlocking or pairing the wrong data. Buckets carry priorities (px_op_options.priority):
the bucket of the first layers, whose parameters the next forward needs first, goes
first where transfers queue on the fabric (ByteScheduler's order; README, "Priorities").
Every wait has a deadline (the client's
op_timeout); a failure (a peer or daemon lost, a mismatch) is raised from backward(),
step() or the next call, as the matching parallax exception, never as a hang.

CUDA parameters: their buckets are px_alloc_ex device memory (PX_MEMORY_CUDA) on the
parameters' device, one bucket per (device, dtype), each allreduced in place on the
current torch stream of the hook that completes it (the stream backward accumulated the
gradients on), so the allreduce reads them after they are written and every kernel queued
later on that stream (the rest of backward, the optimizer) sees the mean. The submission
overlaps backward as on the host: the CPU goes on queuing backward's kernels. A device
operation's host function holds its stream until the step is complete (README, GPUs), so
the kernels queued behind it wait for it; one stream keeps every worker's device
operations in one order, which the daemon needs (a side stream could run them in another
order on each worker). Broadcasts of CUDA tensors pack them into one device buffer.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from .. import _buffers, _lib
from ..client import Client
from ..errors import Mismatch, OutOfMemory, ParallaxError, invalid
from ..request import Request

__all__ = ["client", "Compression", "DistributedDataParallel", "DistributedOptimizer",
           "broadcast_parameters", "broadcast_optimizer_state", "BucketInfo"]

_GRAD_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_default_client: Optional[Client] = None
# Names of wrappers per client, so that a second wrapper named alike gets "name.2" (the
# same on every worker when every worker builds its wrappers in the same order).
_names: "weakref.WeakKeyDictionary[Client, Dict[str, int]]" = weakref.WeakKeyDictionary()


class Compression:
    """Horovod's compression= argument (hvd.Compression.fp16): what float32 gradients'
    sums travel in between nodes. Here it is the buckets' wire dtype
    (px_dense_options.wire_dtype): the daemons round each partial sum to 16 bits as it
    leaves a node and add in f32, and every worker gets the same rounded mean; buckets of
    other dtypes, and everything within one node, are not rounded. bf16 keeps f32's
    range (DDP's bf16_compress_hook); fp16 keeps 3 more bits and saturates at +-65504."""
    none = "f32"
    fp16 = "f16"
    bf16 = "bf16"


_COMPRESSIONS = {"f32": "f32", "none": "f32", "f16": "f16", "fp16": "f16", "bf16": "bf16"}


def _wire_dtype(compression: Any, name: str) -> str:
    key = "f32" if compression is None else compression
    if key not in _COMPRESSIONS:
        raise invalid(f"'{name}': compression {compression!r} is not one of "
                      "Compression.none, Compression.fp16, Compression.bf16")
    return _COMPRESSIONS[key]


def client() -> Client:
    """The process's default client: parallax.Client() from the environment (PARALLAX_*,
    torchrun or Slurm), created on first use and reused by every wrapper given none."""
    global _default_client
    if _default_client is None or _default_client._handle is None:
        _default_client = Client()
    return _default_client


def _unique_name(c: Client, name: str) -> str:
    used = _names.setdefault(c, {})
    n = used.get(name, 0) + 1
    used[name] = n
    return name if n == 1 else f"{name}.{n}"


def _fingerprint(value: Any) -> int:
    # Python's hash() of strings differs per process: workers must agree, so blake2b.
    digest = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _with_context(e: ParallaxError, context: str) -> ParallaxError:
    """The same exception class and status, its message followed by what we were doing."""
    return type(e)(e.status, f"{e.message} [{context}]")


# --- byte-level packing, for broadcasts ---------------------------------------------------
# A broadcast only copies bytes, so every tensor, whatever its dtype (bool and int8
# included), goes into one flat buffer and one px_broadcast. A 16-byte header carries a
# fingerprint of the layout (dtypes and shapes) and the size, so that a worker whose
# tensors differ from the root's learns it instead of silently reading shifted bytes.
_HEADER = 16
_ALIGN = 16  # Tensor.view(dtype) needs offsets aligned to the element size (complex128: 16)


def _pack_layout(tensors: Sequence[torch.Tensor]) -> Tuple[List[int], int]:
    offsets, at = [], _HEADER
    for t in tensors:
        offsets.append(at)
        at += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return offsets, at


def _byte_view(flat: torch.Tensor, offset: int, t: torch.Tensor) -> torch.Tensor:
    n = t.numel() * t.element_size()
    return flat[offset:offset + n].view(t.dtype).view(t.shape)


def _flat_buffer(c: Client, nbytes: int, device: torch.device) -> torch.Tensor:
    """nbytes (a multiple of 16) of arena (or, on a CUDA device, px_alloc_ex device memory)
    as uint8; ordinary memory of that device if none is left (a broadcast is rare: one copy
    more each way is fine)."""
    try:
        return c.empty_tensor(nbytes // 8, torch.int64, device).view(torch.uint8)
    except OutOfMemory:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _buffer_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    """Where a broadcast's flat buffer goes: the first CUDA tensor's device if there is one
    (host tensors among them, such as torch 2's Adam "step", are copied in and out of it),
    else host memory."""
    for t in tensors:
        if t.device.type == "cuda":
            return t.device
    return torch.device("cpu")


def _check_devices(named: List[Tuple[str, torch.Tensor]], what: str) -> None:
    for n, t in named:
        if t.device.type not in ("cpu", "cuda"):
            raise invalid(f"{what}: '{n}' is on {t.device}; Parallax takes host (cpu) and "
                          "CUDA tensors")


def _broadcast_tensors(c: Client, tensors: List[torch.Tensor], names: List[str], root: int,
                       var: Any, buffer: torch.Tensor) -> None:
    """The root's tensors into every worker's, in place, through the flat buffer (of
    _pack_layout's size, host or CUDA memory) and one px_broadcast of var (int64 words; on
    a CUDA buffer ordered on the current stream, and waited for)."""
    offsets, total = _pack_layout(tensors)
    words = buffer.view(torch.int64)
    layout = _fingerprint([(str(t.dtype), tuple(t.shape)) for t in tensors])
    words[:2].copy_(torch.tensor([layout, total], dtype=torch.int64))
    if c.rank == root:
        for t, o in zip(tensors, offsets):
            _byte_view(buffer, o, t).copy_(t.detach())
    var.broadcast(words, root=root).wait()
    got_layout, got_total = words[:2].tolist()  # from a CUDA buffer: after the broadcast
    if got_layout != layout or got_total != total:
        raise Mismatch(_lib.ERR_MISMATCH,
                       f"broadcast '{var.name}': the root (rank {root}) sent another layout "
                       f"than rank {c.rank} holds ({len(tensors)} tensors: "
                       f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): "
                       "different models or parameter shapes")
    if c.rank != root:
        with torch.no_grad():
            for t, o in zip(tensors, offsets):
                t.copy_(_byte_view(buffer, o, t))


def _broadcast_once(c: Client, named: List[Tuple[str, torch.Tensor]], root: int,
                    var_name: str) -> None:
    tensors = [t for _, t in named]
    total = _pack_layout(tensors)[1]
    # A variable per call: a worker whose tensors total another size fails at once with
    # the daemon's Mismatch naming it, rather than waiting on a step nobody else takes.
    var = c.dense(var_name, total // 8, torch.int64)
    _broadcast_tensors(c, tensors, [n for n, _ in named], root, var,
                       _flat_buffer(c, total, _buffer_device(tensors)))


def _named_tensors(params: Any) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = [x if isinstance(x, tuple) else (str(i), x) for i, x in enumerate(params)]
    return [(str(n), t) for n, t in items if isinstance(t, torch.Tensor)]


def broadcast_parameters(params: Union[Dict[str, torch.Tensor], Iterable[Any]],
                         root_rank: int = 0, client: Optional[Client] = None, *,
                         name: Optional[str] = None) -> None:
    """Overwrites every worker's tensors with the root's (Horovod's broadcast_parameters):
    a state_dict, named_parameters() or a list of tensors, in place. Every worker must call
    it in the same order with the same layout; a different layout raises Mismatch. Host
    and CUDA tensors (mixed too): with any CUDA tensor, one device buffer on its device
    carries them all (px_broadcast_ex, PX_MEMORY_CUDA, ordered on the current stream)."""
    c = client or globals()["client"]()
    named = _named_tensors(params)
    _check_devices(named, "broadcast_parameters")
    if named:
        _broadcast_once(c, named, root_rank, name or _unique_name(c, "px.torch.broadcast"))


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              client: Optional[Client] = None) -> None:
    """Overwrites every worker's optimizer state (its tensors, numeric scalars, and numeric
    hyperparameters of the param groups such as lr or betas) with the root's. Every worker
    must hold state of the same structure (e.g. after loading the same checkpoint, or after
    a first step); unlike Horovod it does not create missing state. State on CUDA
    (exp_avg of CUDA parameters, beside torch 2's host "step") goes as broadcast_parameters
    carries it: one buffer on the CUDA device."""
    c = client or globals()["client"]()
    tensors: List[Tuple[str, torch.Tensor]] = []
    setters = []  # write scalars back with their Python type once the tensors arrived

    def scalar(label: str, value: Any, put) -> None:
        values = value if isinstance(value, tuple) else (value,)
        if not values or not all(isinstance(v, (int, float, bool)) for v in values):
            return
        holder = torch.tensor([float(v) for v in values], dtype=torch.float64)
        tensors.append((label, holder))
        kinds = [type(v) for v in values]
        setters.append(lambda: put(tuple(k(x) for k, x in zip(kinds, holder.tolist()))
                                   if isinstance(value, tuple) else kinds[0](holder.item())))

    for gi, group in enumerate(optimizer.param_groups):
        for key in sorted(k for k in group if k != "params"):
            scalar(f"group{gi}.{key}", group[key], functools.partial(group.__setitem__, key))
        for pi, p in enumerate(group["params"]):
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                v = state[key]
                if isinstance(v, torch.Tensor):
                    tensors.append((f"group{gi}.param{pi}.{key}", v))
                else:
                    scalar(f"group{gi}.param{pi}.{key}", v,
                           functools.partial(state.__setitem__, key))
    if tensors:
        _check_devices(tensors, "broadcast_optimizer_state")
        _broadcast_once(c, tensors, root_rank, _unique_name(c, "px.torch.broadcast_optimizer"))
        for put in setters:
            put()


# --- gradient buckets ---------------------------------------------------------------------
@dataclass
class BucketInfo:
    """A bucket as the user sees it: its Parallax variable's name, the flat tensor every
    gradient of the bucket is a view into (arena, or px_alloc_ex device memory for CUDA
    parameters), those parameters' names, and the
    DenseVariable (for its stats()), and the priority its allreduces carry."""
    name: str
    buffer: torch.Tensor
    params: List[str]
    variable: Any
    priority: int = 0


@dataclass
class _Slot:
    name: str
    param: torch.Tensor
    view: torch.Tensor
    bucket: "_Bucket"


@dataclass
class _Bucket:
    index: int
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")
    name: str = "?"
    slots: List[_Slot] = field(default_factory=list)
    numel: int = 0
    buffer: Optional[torch.Tensor] = None
    var: Any = None
    request: Optional[Request] = None
    ready: int = 0
    priority: int = 0

    def describe(self) -> str:
        names = [s.name for s in self.slots]
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        return (f"bucket {self.index} '{self.name}': {self.numel} "
                f"{str(self.dtype).replace('torch.', '')} elements of {shown}")


def _assign_buckets(named: List[Tuple[str, torch.Tensor]], cap_bytes: int,
                    first_cap_bytes: int) -> List[_Bucket]:
    """DDP's assignment: parameters in reverse registration order (about the order backward
    produces their gradients), one open bucket per (device, dtype), closed once it holds at
    least its limit (the first one per dtype small, so that communication starts early;
    then the cap). A parameter larger than the cap closes the bucket it joins."""
    open_: Dict[Tuple[torch.device, torch.dtype], _Bucket] = {}
    closed_count: Dict[Tuple[torch.device, torch.dtype], int] = {}
    done: List[_Bucket] = []
    for n, p in reversed(named):
        key = (p.device, p.dtype)
        b = open_.setdefault(key, _Bucket(-1, p.dtype, p.device))
        b.slots.append(_Slot(n, p, p, b))  # view filled once the buffer exists
        b.numel += p.numel()
        limit = first_cap_bytes if closed_count.get(key, 0) == 0 else cap_bytes
        if b.numel * p.element_size() >= limit:
            done.append(open_.pop(key))
            closed_count[key] = closed_count.get(key, 0) + 1
    done.extend(open_.values())
    for i, b in enumerate(done):
        b.index = i
    return done


def _assign_priorities(buckets: List[_Bucket], named: List[Tuple[str, torch.Tensor]]) -> None:
    """ByteScheduler's order: the next forward needs the first layers' parameters first, so
    their bucket gets the highest priority (255) and the bucket whose earliest parameter (in
    registration order, about forward order) comes last gets 0, the others spread between.
    Backward produces those gradients last: with priority, their allreduce overtakes the
    later layers' chunks still queued for the link."""
    position = {id(p): i for i, (_, p) in enumerate(named)}
    by_need = sorted(buckets, key=lambda b: min(position[id(s.param)] for s in b.slots))
    last = max(1, len(by_need) - 1)
    for k, b in enumerate(by_need):
        b.priority = 255 - (255 * k) // last


def _hook(engine_ref: "weakref.ref[_GradBuckets]", i: int, *_: Any) -> None:
    # A weak reference: the AccumulateGrad node (C++) holds this hook, and a strong one would
    # keep the engine, its arena buffers and the module alive in a cycle GC cannot see.
    engine = engine_ref()
    if engine is not None:
        engine.on_grad_ready(i)


class _GradBuckets:
    """The bucket engine shared by DistributedDataParallel and DistributedOptimizer.

    A round is `passes` backward passes: a parameter is ready once its hook fired that many
    times; a bucket whose parameters are all ready is allreduced at once, in place.
    synchronize() submits the rest (parameters unused this round contribute zeros) and
    waits for all. With end_of_backward, synchronize() runs at the end of every backward
    (DDP: grads are averaged when loss.backward() returns)."""

    def __init__(self, c: Client, named: List[Tuple[str, torch.Tensor]], name: str,
                 bucket_cap_mb: float, first_bucket_mb: float, passes: int,
                 end_of_backward: bool, prioritize: bool = True, wire_dtype: str = "f32"):
        seen, unique = set(), []
        for n, p in named:
            if p.requires_grad and id(p) not in seen:  # tied weights: reduced once
                seen.add(id(p))
                unique.append((n, p))
        for n, p in unique:
            if p.device.type not in ("cpu", "cuda"):
                raise invalid(f"'{name}': parameter '{n}' is on {p.device}; Parallax takes "
                              "host (cpu) and CUDA parameters")
            if p.dtype not in _GRAD_DTYPES:
                raise invalid(f"'{name}': parameter '{n}' is {p.dtype}; gradients must be "
                              "float32, float64, float16 or bfloat16")
        if not unique or passes < 1:
            raise invalid(f"'{name}': " + ("backward_passes_per_step must be at least 1"
                                           if unique else "no parameter requires a gradient"))
        self.client, self.name, self.passes = c, name, passes
        self.wire_dtype = wire_dtype  # of float32 buckets (_wire_dtype)
        self.end_of_backward = end_of_backward
        self.sync = True
        cap = max(1, int(bucket_cap_mb * (1 << 20)))
        self.buckets = _assign_buckets(unique, cap, min(cap, int(first_bucket_mb * (1 << 20))))
        for b in self.buckets:
            b.name = f"{name}.b{b.index}"
        if prioritize:
            _assign_priorities(self.buckets, unique)
        self._check_layout()
        self.slots: List[_Slot] = []
        for b in self.buckets:
            self._allocate(b)
            self.slots.extend(b.slots)
        self._marks = [0] * len(self.slots)
        self._round_open = False
        self._callback_queued = False
        self._accumulators = []
        me = weakref.ref(self)
        with torch.enable_grad():
            for i, s in enumerate(self.slots):
                # torch 1.13 has no register_post_accumulate_grad_hook: Horovod's way to the
                # parameter's AccumulateGrad node. A hook on it runs once the gradient is in
                # p.grad. The node lives as long as we keep it.
                acc = s.param.expand_as(s.param).grad_fn.next_functions[0][0]
                acc.register_hook(functools.partial(_hook, me, i))
                self._accumulators.append(acc)

    # --- construction ---------------------------------------------------------------------
    def _check_layout(self) -> None:
        """Every worker must bucket the same shapes: compared before any bucket is
        registered (as DDP verifies shapes at construction), so that every worker raises
        Mismatch naming the first differing bucket, instead of one worker failing at
        registration while the others wait on it."""
        # Host tensors (the buckets' devices are not compared: a worker's GPU is its own).
        c, w = self.client, self.client.world_size
        per = [[_fingerprint((str(b.dtype), [tuple(s.param.shape) for s in b.slots])),
                b.numel, _buffers.dtype_code(b.dtype)] for b in self.buckets]
        mine = torch.tensor([len(self.buckets), _fingerprint(per)], dtype=torch.int64)
        summary = c.dense(f"{self.name}.layout", 2, torch.int64)
        rows = summary.allgather(mine).wait().reshape(w, 2).tolist()
        if all(r == mine.tolist() for r in rows):
            return
        counts = [3 * int(r[0]) for r in rows]
        detail = c.dense(f"{self.name}.layout.buckets", max(counts), torch.int64)
        flat = detail.allgatherv(torch.tensor(per, dtype=torch.int64).reshape(-1),
                                 counts).wait().tolist()
        by_rank, at = [], 0
        for n in counts:
            by_rank.append([tuple(flat[k:k + 3]) for k in range(at, at + n, 3)])
            at += n
        for i in range(max(len(r) for r in by_rank)):
            entries = [r[i] if i < len(r) else None for r in by_rank]
            if len(set(entries)) > 1:
                break
        here = self.buckets[i].describe() if i < len(self.buckets) else "nothing"
        seen = "; ".join(f"rank {r}: " + (f"{e[1]} {_buffers.DTYPE_NAMES[int(e[2])]} elements"
                                          if e else "no such bucket")
                         for r, e in enumerate(entries))
        if len({e[1:] for e in entries if e}) == 1 and None not in entries:
            seen += ", the same sizes but other shapes or order"
        raise Mismatch(_lib.ERR_MISMATCH,
                       f"'{self.name}': bucket {i} ('{self.name}.b{i}') differs across "
                       f"workers ({seen}); here (rank {c.rank}) it is {here}: every worker "
                       "must wrap the same model (same parameter shapes, dtypes and order)")

    def _allocate(self, b: _Bucket) -> None:
        c = self.client
        try:
            b.buffer = c.empty_tensor(b.numel, b.dtype, b.device)
        except OutOfMemory as e:
            total = sum(x.numel * x.buffer.element_size() if x.buffer is not None else 0
                        for x in self.buckets)
            raise _with_context(e, f"'{self.name}' bucket {b.index} needs "
                                   f"{b.numel * b.slots[0].param.element_size() >> 20} MiB of "
                                   f"{'arena' if b.device.type == 'cpu' else b.device} after "
                                   f"{total >> 20} MiB of earlier buckets; set "
                                   "PARALLAX_ARENA_BYTES (or Client(arena_bytes=)) to hold "
                                   "every gradient plus some room") from None
        at = 0
        with torch.no_grad():
            for s in b.slots:
                n = s.param.numel()
                s.view = b.buffer[at:at + n].view(s.param.shape)
                at += n
                # Existing gradients move into the bucket; a parameter without one starts
                # at zero, so that the first backward accumulates into its view.
                if s.param.grad is not None:
                    s.view.copy_(s.param.grad)
                else:
                    s.view.zero_()
                s.param.grad = s.view
        wire = self.wire_dtype if b.dtype == torch.float32 else "f32"
        b.var = c.dense(b.name, b.numel, b.dtype, op="mean", wire_dtype=wire)

    # --- a round --------------------------------------------------------------------------
    def on_grad_ready(self, i: int) -> None:
        """AccumulateGrad's hook: the parameter's gradient for this backward is in p.grad."""
        if not self.sync:
            return  # no_sync(): gradients accumulate locally, in p.grad, wherever it is
        s = self.slots[i]
        try:
            self._adopt(s)
            self._marks[i] += 1
            if not self._round_open:
                self._round_open = True
            if self.end_of_backward and not self._callback_queued:
                # As DDP: the engine runs this once the whole backward is done.
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
                self._callback_queued = True
            if self._marks[i] == self.passes:
                b = s.bucket
                b.ready += 1
                if b.ready == len(b.slots):
                    self._launch(b)
            elif self._marks[i] > self.passes:
                raise invalid(
                    f"'{self.name}': parameter '{s.name}' produced its gradient "
                    f"{self._marks[i]} times in a round of {self.passes} backward pass(es): "
                    "a second backward before the gradients were synchronized (use "
                    "no_sync() or backward_passes_per_step to accumulate)")
        except BaseException:
            self.abandon()
            raise

    def _adopt(self, s: _Slot) -> None:
        g = s.param.grad
        if g is None or g.data_ptr() == s.view.data_ptr():
            return
        if g.is_sparse:
            raise invalid(f"'{self.name}': parameter '{s.name}' has a sparse gradient; dense "
                          "buckets cannot hold it (use parallax.torch's sparse Embedding)")
        # zero_grad(set_to_none=True) dropped the view and AccumulateGrad made a new tensor:
        # copy it into the bucket (as DDP does) and point p.grad at the view again.
        with torch.no_grad():
            s.view.copy_(g)
        s.param.grad = s.view

    def _launch(self, b: _Bucket) -> None:
        try:
            # In place: the grads are views into it.
            b.request = b.var.allreduce(b.buffer, priority=b.priority)
        except ParallaxError as e:
            raise _with_context(e, f"submitting {b.describe()}") from None

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        if self._round_open:
            self.synchronize()

    def synchronize(self) -> None:
        """Submits every bucket not submitted yet (parameters without a gradient this round
        contribute zeros), waits for all under one deadline (the client's op_timeout), and
        leaves every p.grad the view holding the mean over all workers."""
        try:
            for b in self.buckets:
                if b.request is None:
                    with torch.no_grad():
                        for s in b.slots:
                            if s.param.grad is None:
                                s.view.zero_()
                                s.param.grad = s.view
                            else:
                                self._adopt(s)
                    self._launch(b)
            deadline = time.monotonic() + self.client.op_timeout
            for b in self.buckets:
                try:
                    b.request.wait(max(0.0, deadline - time.monotonic()))
                except ParallaxError as e:
                    raise _with_context(e, f"waiting for {b.describe()}") from None
                b.request = None
        except BaseException:
            self.abandon()
            raise
        self._reset()

    def _reset(self) -> None:
        for b in self.buckets:
            b.ready = 0
            b.request = None
        self._marks = [0] * len(self.slots)
        self._round_open = False

    def abandon(self) -> None:
        """Ends a failed round: requests in flight are cancelled (nothing writes the buckets
        later, and the other workers' same steps fail at once instead of waiting for this
        one). The job cannot go on after this (as with DDP after a failed collective)."""
        for b in self.buckets:
            if b.request is not None:
                try:
                    b.request.cancel()
                except ParallaxError:
                    pass
        self._reset()

    def check_idle(self, where: str) -> None:
        """Raises if a round was left half done (a backward interrupted by an exception)."""
        if self._round_open:
            pending = [b.var.name for b in self.buckets if b.request is not None]
            self.abandon()
            raise invalid(f"'{self.name}': {where} while the previous round's gradients were "
                          f"not synchronized (buckets in flight: {pending or 'none'}); a "
                          "backward pass was interrupted, and the job cannot continue")

    def info(self) -> List[BucketInfo]:
        return [BucketInfo(b.var.name, b.buffer, [s.name for s in b.slots], b.var, b.priority)
                for b in self.buckets]


# --- the wrappers -------------------------------------------------------------------------
class DistributedDataParallel(torch.nn.Module):
    """torch's DistributedDataParallel over Parallax: after loss.backward() every
    parameter's .grad is the mean over all workers, a view into a flat arena bucket.

    At construction rank 0's parameters and buffers are broadcast (as DDP; init_sync) and
    the workers check that they bucket the same shapes (Mismatch otherwise). With
    broadcast_buffers, rank 0's buffers are broadcast at each training forward. Parameters
    unused in a backward contribute zeros (find_unused_parameters is always on).
    first_bucket_mb is DDP's small first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES). name
    prefixes the Parallax variables ("ddp.b0", ...); a second wrapper gets "ddp.2".
    prioritize (default) gives the first layers' bucket the highest transfer priority
    (_assign_priorities); False sends every bucket at priority 0, in submission order.
    Parameters may be on CUDA: their buckets are then px_alloc_ex device memory, reduced
    on the current stream (module docstring); move the module before wrapping it.
    compression (Compression.bf16 / .fp16, Horovod's spelling): float32 buckets' sums
    cross nodes in 16 bits (Compression); default none.
    """

    def __init__(self, module: torch.nn.Module, client: Optional[Client] = None,
                 bucket_cap_mb: float = 25.0, name: str = "ddp", broadcast_buffers: bool = True,
                 *, first_bucket_mb: float = 1.0, init_sync: bool = True,
                 prioritize: bool = True, compression: Any = Compression.none):
        super().__init__()
        wire_dtype = _wire_dtype(compression, name)  # refused before anything is made
        self.module = module
        self.client = client or globals()["client"]()
        self.name = _unique_name(self.client, name)
        self.broadcast_buffers = broadcast_buffers
        self._buffer_sync: Dict[int, Tuple[Any, torch.Tensor]] = {}
        if init_sync:
            broadcast_parameters(module.state_dict(), 0, self.client, name=f"{self.name}.init")
        self._engine = _GradBuckets(self.client, list(module.named_parameters()), self.name,
                                    bucket_cap_mb, first_bucket_mb, 1, end_of_backward=True,
                                    prioritize=prioritize, wire_dtype=wire_dtype)

    @property
    def buckets(self) -> List[BucketInfo]:
        """The buckets in submission order (their variables, arena buffers, parameters)."""
        return self._engine.info()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._before_forward()
        return self.module(*args, **kwargs)

    def _before_forward(self) -> None:
        """What a forward does first (also parallelize()'s forward pre-hook)."""
        if torch.is_grad_enabled():
            self._engine.check_idle("forward() called")
            if self.broadcast_buffers and self.module.training and self._engine.sync:
                self._sync_buffers()

    def _sync_buffers(self) -> None:
        named = list(self.module.named_buffers())
        if not named:
            return
        tensors = [b for _, b in named]
        total = _pack_layout(tensors)[1]
        # A variable and flat buffer kept per size: a forward costs one px_broadcast.
        if total not in self._buffer_sync:
            var = self.client.dense(f"{self.name}.buffers.{total}", total // 8, torch.int64)
            self._buffer_sync[total] = (var, _flat_buffer(self.client, total,
                                                          _buffer_device(tensors)))
        var, flat = self._buffer_sync[total]
        _broadcast_tensors(self.client, tensors, [n for n, _ in named], 0, var, flat)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, with no communication; the
        first backward after it synchronizes the sum (as DDP's no_sync)."""
        previous, self._engine.sync = self._engine.sync, False
        try:
            yield
        finally:
            self._engine.sync = previous


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods of the class DistributedOptimizer builds (see there)."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]],
                 c: Client, bucket_cap_mb: float, backward_passes_per_step: int, name: str,
                 first_bucket_mb: float, prioritize: bool, wire_dtype: str):
        # Horovod's construction: the user's optimizer class, re-initialised on its param
        # groups (which carry their hyperparameters); its state carries over.
        super(self.__class__, self).__init__(optimizer.param_groups)
        self.state.update(optimizer.state)
        if named_parameters is None:
            named = [(f"param_groups[{gi}][{pi}]", p)
                     for gi, g in enumerate(self.param_groups) for pi, p in enumerate(g["params"])]
        else:
            named = list(named_parameters)
            given = {id(p) for _, p in named}
            missing = [p for g in self.param_groups for p in g["params"] if id(p) not in given]
            if missing:
                raise invalid(f"'{name}': named_parameters lacks {len(missing)} parameter(s) "
                              "of the optimizer (pass model.named_parameters())")
        self.client = c
        self._engine = _GradBuckets(c, named, _unique_name(c, name), bucket_cap_mb,
                                    first_bucket_mb, backward_passes_per_step,
                                    end_of_backward=False, prioritize=prioritize,
                                    wire_dtype=wire_dtype)
        self._synchronized = False
        self._skip_sync = False

    @property
    def buckets(self) -> List[BucketInfo]:
        return self._engine.info()

    def synchronize(self) -> None:
        """Submits the buckets left and waits: every gradient is then the mean over all
        workers. step() calls it unless skip_synchronize()."""
        self._engine.synchronize()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """step() inside does not synchronize: for synchronize(); clip grads; step()."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._skip_sync and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        super(self.__class__, self).step()
        return loss

    def zero_grad(self, set_to_none: bool = False) -> None:
        # Zeroing buckets being reduced in place would race the daemon (Horovod refuses too).
        self._engine.check_idle("zero_grad() called after backward() and before step() or "
                                "synchronize()")
        super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         client: Optional[Client] = None, bucket_cap_mb: float = 25.0,
                         backward_passes_per_step: int = 1, *, name: str = "opt",
                         first_bucket_mb: float = 1.0, prioritize: bool = True,
                         compression: Any = Compression.none) -> torch.optim.Optimizer:
    """Horovod's DistributedOptimizer: an optimizer of `optimizer`'s class whose step()
    first waits for the gradients' mean over all workers, reduced in arena buckets as
    backward produces them (DistributedDataParallel's engine). With
    backward_passes_per_step = k a bucket goes once accumulated over k backward passes
    (scale the loss by 1/k). synchronize() + skip_synchronize() to clip gradients.
    prioritize: as DistributedDataParallel's. CUDA parameters: as DistributedDataParallel's
    (device buckets reduced on the current stream). compression: as Horovod's
    (Compression.fp16 / .bf16: float32 sums cross nodes in 16 bits; Compression)."""
    wire_dtype = _wire_dtype(compression, name)  # refused before anything is made
    c = client or globals()["client"]()
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    return cls(optimizer, named_parameters, c, bucket_cap_mb, backward_passes_per_step, name,
               first_bucket_mb, prioritize, wire_dtype)
