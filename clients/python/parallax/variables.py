"""Dense and sparse variables: the operations of the C ABI on NumPy arrays and tensors."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import _buffers, _lib
from ._buffers import np  # None without NumPy
from .errors import check, invalid
from .request import Request

if TYPE_CHECKING:
    from .client import Client

_OPS = {"sum": _lib.SUM, "mean": _lib.MEAN, "min": _lib.MIN, "max": _lib.MAX,
        "prod": _lib.PROD}
_OPTIMIZERS = {"sgd": _lib.OPT_SGD, "adagrad": _lib.OPT_ADAGRAD, "adam": _lib.OPT_ADAM}
_INITIALIZERS = {"zeros": _lib.INIT_ZEROS, "uniform": _lib.INIT_UNIFORM,
                 "normal": _lib.INIT_NORMAL}
_CONSISTENCY = {"sync": _lib.SYNC, "async": _lib.ASYNC, "bounded": _lib.BOUNDED}
_ROUTES = {"hybrid": _lib.ROUTE_HYBRID, "ps": _lib.ROUTE_PS,
           "allgatherv": _lib.ROUTE_ALLGATHERV, "allreduce": _lib.ROUTE_ALLREDUCE,
           "alltoall": _lib.ROUTE_ALLTOALL, "auto": _lib.ROUTE_AUTO}
_NONFINITE = {"reject": _lib.NONFINITE_REJECT, "skip": _lib.NONFINITE_SKIP}
_SPLITS = {"rows": _lib.SPLIT_ROWS, "columns": _lib.SPLIT_COLUMNS}
_WIRE_DTYPES = {"f32": _lib.F32, "bf16": _lib.BF16, "f16": _lib.F16}


def _choice(table: dict, value: Any, what: str) -> int:
    if isinstance(value, int) and value in table.values():
        return value
    try:
        return table[str(value).lower()]
    except KeyError:
        raise invalid(f"unknown {what} '{value}' (one of {', '.join(table)})") from None


@dataclass
class Stats:
    """The daemon's counters for a variable on this node (px_var_stats)."""
    ops: int
    bytes: int
    wait_ns: int
    reduce_ns: int
    pull_steps: int
    push_steps: int
    rows_pulled: int
    rows_unique: int
    rows_applied: int
    bytes_sent: int
    bytes_received: int
    request_partitions: int
    search_steps_left: int
    # sparse: the push steps it holds from before this run (a checkpoint's, or a handover's:
    # known once the table has started); 0: none
    restored_steps: int
    rows_served_ahead: int  # sparse, prefetch: rows served ahead of the previous push step
    # sparse, with a hot-row cache (cache_rows): rows served from it, rows asked of owners
    # while it looked, rows kept now, payload bytes it kept off the wire, held gradient rows
    # sent (ABI 1.14)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_rows: int = 0
    cache_bytes_saved: int = 0
    cache_rows_flushed: int = 0


def _on_stream(opts: _lib.OpOptions, device: int) -> None:
    """Makes opts a PX_MEMORY_CUDA operation on device, ordered on that device's current
    torch stream (as NCCL's collectives are): work queued on it after the call sees the
    result, and the request's wait() returns once the result is there."""
    import torch
    opts.memory_kind = _lib.MEMORY_CUDA
    opts.device = device
    opts.stream = torch.cuda.current_stream(device).cuda_stream


def _op_options(priority: int = 0, root: int = 0) -> _lib.OpOptions:
    options = _lib.OpOptions()
    _lib.lib.px_op_options_init(ctypes.byref(options))
    if not 0 <= priority <= 255:
        raise invalid(f"priority {priority} is outside 0..255")
    options.priority = priority
    options.root = root
    return options


class _Variable:
    def __init__(self, client: "Client", name: str):
        self.client = client
        self.name = name
        self._handle: Optional[int] = None

    def _h(self) -> int:
        self.client._h()  # a closed client's variables fail in Python, clearly
        return self._handle

    def stats(self) -> Stats:
        s = _lib.VarStats()
        s.struct_size = ctypes.sizeof(s)
        check(_lib.lib.px_var_stats_get(self._h(), ctypes.byref(s)), self.client._handle)
        return Stats(*(getattr(s, f.name) for f in fields(Stats)))

    def _describe(self, op: str) -> str:
        return f"{op} of '{self.name}' on {self.client.describe()}"


class DenseVariable(_Variable):
    """A dense variable of `count` elements (a shape is flattened). The n-th allreduce of
    it on every worker is its step n; broadcast and allgather steps are numbered apart.
    Operations return a Request whose wait() returns the out buffer.

    wire_dtype ("f32", or lossy "bf16"/"f16" for a float32 variable, ABI 1.13): what its
    allreduce's sums are carried in between nodes (px_dense_options.wire_dtype)."""

    def __init__(self, client: "Client", name: str, count: Any, dtype: Any, op: str,
                 wire_dtype: str = "f32"):
        super().__init__(client, name)
        self.shape = (count,) if isinstance(count, int) else tuple(count)
        self.count = int(math.prod(self.shape))
        self.dtype = _buffers.dtype_code(dtype)
        self.op = _choice(_OPS, op, "reduce op")
        self.wire_dtype = wire_dtype
        o = _lib.DenseOptions()
        _lib.lib.px_dense_options_init(ctypes.byref(o))
        o.wire_dtype = _choice(_WIRE_DTYPES, wire_dtype, "wire dtype")
        handle = ctypes.c_void_p()
        check(_lib.lib.px_register_dense_ex(client._h(), name.encode(), self.dtype, self.count,
                                            self.op, ctypes.byref(o), ctypes.byref(handle)),
              client._handle)
        self._handle = handle.value

    def __repr__(self) -> str:
        return (f"<parallax.DenseVariable '{self.name}' {self.count} x "
                f"{_buffers.DTYPE_NAMES[self.dtype]}>")

    def _check(self, buf: _buffers.Buffer, what: str, count: int) -> None:
        if buf.dtype != self.dtype:
            raise invalid(f"{what} of '{self.name}' is {_buffers.DTYPE_NAMES[buf.dtype]}; the "
                          f"variable is {_buffers.DTYPE_NAMES[self.dtype]}")
        if buf.count != count:
            raise invalid(f"{what} of '{self.name}' has {buf.count} elements; "
                          f"{count} expected")

    def _same_size_op(self, fn, op: str, x: Any, out: Any, opts: _lib.OpOptions) -> Request:
        """An operation whose in and out both hold the variable's count (out None: x).

        CUDA tensors (x and out on one device) are ordered on the device's current torch
        stream, as NCCL's collectives are: work queued on it after the call sees the
        result, and the request's wait() returns once out holds it."""
        out = x if out is None else out
        bin_ = _buffers.as_buffer(x, f"{op} input of '{self.name}'", False, cuda_ok=True)
        bout = _buffers.as_buffer(out, f"{op} output of '{self.name}'", True, cuda_ok=True)
        if bin_.device >= 0 or bout.device >= 0:
            if bin_.device != bout.device:
                raise invalid(f"{op} of '{self.name}': input on {x.device}, output on "
                              f"{out.device} (one CUDA device, or host memory for both)")
            _on_stream(opts, bin_.device)
        self._check(bin_, f"{op} input", self.count)
        self._check(bout, f"{op} output", self.count)
        req = ctypes.c_void_p()
        status = fn(self._h(), bin_.address, bout.address, ctypes.byref(opts),
                    ctypes.byref(req))
        return self.client._request(status, req, self._describe(op), out,
                                    (bin_.owner, bout.owner))

    def allreduce(self, x: Any, out: Any = None, *, priority: int = 0) -> Request:
        """Reduces x across every worker into out (None: into x, in place); CUDA tensors
        too (see _same_size_op)."""
        return self._same_size_op(_lib.lib.px_allreduce_ex, "allreduce", x, out,
                                  _op_options(priority))

    def broadcast(self, x: Any, out: Any = None, *, root: int = 0) -> Request:
        """The root worker's x into out (None: into x) on every worker; CUDA tensors too."""
        return self._same_size_op(_lib.lib.px_broadcast_ex, "broadcast", x, out,
                                  _op_options(root=root))

    def _new_like(self, x: Any, count: int) -> Any:
        if _buffers.is_tensor(x):
            import torch
            return torch.empty(count, dtype=x.dtype)  # host: allgather refuses CUDA memory
        if np is None:
            raise invalid(f"'{self.name}': pass a torch tensor or an out buffer (NumPy is "
                          "not installed)")
        return np.empty(count, dtype=x.dtype)

    def allgather(self, x: Any, out: Any = None) -> Request:
        """Every worker's x (count elements) concatenated in rank order into out (world_size
        x count elements; None: a new array of x's kind)."""
        n = self.client.world_size * self.count
        out = self._new_like(x, n) if out is None else out
        bin_ = _buffers.as_buffer(x, f"allgather input of '{self.name}'", False)
        bout = _buffers.as_buffer(out, f"allgather output of '{self.name}'", True)
        self._check(bin_, "allgather input", self.count)
        self._check(bout, "allgather output", n)
        req = ctypes.c_void_p()
        status = _lib.lib.px_allgather_ex(self._h(), bin_.address, bout.address, None,
                                          ctypes.byref(req))
        return self.client._request(status, req, self._describe("allgather"), out,
                                    (bin_.owner, bout.owner))

    def allgatherv(self, x: Any, counts: Sequence[int], out: Any = None) -> Request:
        """Blocks of given sizes (counts[r] elements from rank r, the same list on every
        worker; each at most the variable's count) concatenated in rank order."""
        counts = [int(c) for c in counts]
        if len(counts) != self.client.world_size:
            raise invalid(f"allgatherv of '{self.name}': {len(counts)} counts for "
                          f"{self.client.world_size} workers")
        total = sum(counts)
        out = self._new_like(x, total) if out is None else out
        bin_ = _buffers.as_buffer(x, f"allgatherv input of '{self.name}'", False)
        bout = _buffers.as_buffer(out, f"allgatherv output of '{self.name}'", True)
        self._check(bin_, "allgatherv input", counts[self.client.rank])
        self._check(bout, "allgatherv output", total)
        ccounts = (ctypes.c_uint64 * len(counts))(*counts)
        req = ctypes.c_void_p()
        status = _lib.lib.px_allgatherv_ex(self._h(), bin_.address, ccounts, bout.address,
                                           None, ctypes.byref(req))
        return self.client._request(status, req, self._describe("allgatherv"), out,
                                    (bin_.owner, bout.owner, ccounts))

    def reduce_scatter(self, x: Any, out: Any = None, *, priority: int = 0) -> Request:
        """x holds a block of count elements per rank (world_size x count); each block is
        reduced across every worker with the variable's op, and this rank's block comes
        back in out (count elements; None: a new array of x's kind)."""
        n = self.client.world_size * self.count
        out = self._new_like(x, self.count) if out is None else out
        bin_ = _buffers.as_buffer(x, f"reduce_scatter input of '{self.name}'", False)
        bout = _buffers.as_buffer(out, f"reduce_scatter output of '{self.name}'", True)
        self._check(bin_, "reduce_scatter input", n)
        self._check(bout, "reduce_scatter output", self.count)
        req = ctypes.c_void_p()
        status = _lib.lib.px_reduce_scatter_ex(self._h(), bin_.address, bout.address,
                                               ctypes.byref(_op_options(priority)),
                                               ctypes.byref(req))
        return self.client._request(status, req, self._describe("reduce_scatter"), out,
                                    (bin_.owner, bout.owner))

    def alltoall(self, x: Any, out: Any = None) -> Request:
        """x holds a block of count elements for each rank, in rank order; out gets the
        block each rank sent this one, in rank order (world_size x count; None: new)."""
        n = self.client.world_size * self.count
        out = self._new_like(x, n) if out is None else out
        bin_ = _buffers.as_buffer(x, f"alltoall input of '{self.name}'", False)
        bout = _buffers.as_buffer(out, f"alltoall output of '{self.name}'", True)
        self._check(bin_, "alltoall input", n)
        self._check(bout, "alltoall output", n)
        req = ctypes.c_void_p()
        status = _lib.lib.px_alltoall_ex(self._h(), bin_.address, bout.address, None,
                                         ctypes.byref(req))
        return self.client._request(status, req, self._describe("alltoall"), out,
                                    (bin_.owner, bout.owner))

    def alltoallv(self, x: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
                  out: Any = None) -> Request:
        """Blocks of given sizes: send_counts[r] elements of x go to rank r and
        recv_counts[s] elements of out come from rank s (each at most the variable's count;
        rank s's send_counts for this rank must be this rank's recv_counts[s])."""
        world = self.client.world_size
        send_counts = [int(c) for c in send_counts]
        recv_counts = [int(c) for c in recv_counts]
        if len(send_counts) != world or len(recv_counts) != world:
            raise invalid(f"alltoallv of '{self.name}': {len(send_counts)} send and "
                          f"{len(recv_counts)} receive counts for {world} workers")
        out = self._new_like(x, sum(recv_counts)) if out is None else out
        bin_ = _buffers.as_buffer(x, f"alltoallv input of '{self.name}'", False)
        bout = _buffers.as_buffer(out, f"alltoallv output of '{self.name}'", True)
        self._check(bin_, "alltoallv input", sum(send_counts))
        self._check(bout, "alltoallv output", sum(recv_counts))
        csend = (ctypes.c_uint64 * world)(*send_counts)
        crecv = (ctypes.c_uint64 * world)(*recv_counts)
        req = ctypes.c_void_p()
        status = _lib.lib.px_alltoallv_ex(self._h(), bin_.address, csend, bout.address, crecv,
                                          None, ctypes.byref(req))
        return self.client._request(status, req, self._describe("alltoallv"), out,
                                    (bin_.owner, bout.owner, csend, crecv))


def _sparse_options(*, optimizer: str = "sgd", lr: Optional[float] = None,
                    beta1: Optional[float] = None, beta2: Optional[float] = None,
                    epsilon: Optional[float] = None,
                    initial_accumulator: Optional[float] = None, initializer: str = "zeros",
                    seed: int = 0, init_low: Optional[float] = None,
                    init_high: Optional[float] = None, init_std: Optional[float] = None,
                    aggregation: str = "sum", consistency: str = "sync", staleness: int = 0,
                    partitions: int = 0, route: str = "hybrid", nonfinite: str = "reject",
                    alltoall_split: str = "rows", wire_dtype: str = "f32",
                    prefetch: bool = False, cache_rows: int = 0,
                    cache_staleness: int = 0, replicas: int = 1) -> _lib.SparseOptions:
    """px_sparse_options from SparseVariable's keyword options."""
    o = _lib.SparseOptions()
    _lib.lib.px_sparse_options_init(ctypes.byref(o))
    o.optimizer = _choice(_OPTIMIZERS, optimizer, "optimizer")
    for field, value in (("learning_rate", lr), ("beta1", beta1), ("beta2", beta2),
                         ("epsilon", epsilon), ("initial_accumulator", initial_accumulator),
                         ("init_low", init_low), ("init_high", init_high),
                         ("init_std", init_std)):
        if value is not None:
            setattr(o, field, float(value))
    o.initializer = _choice(_INITIALIZERS, initializer, "initializer")
    o.init_seed = int(seed)
    o.aggregation = _choice({"sum": _lib.SUM, "mean": _lib.MEAN}, aggregation, "aggregation")
    o.consistency = _choice(_CONSISTENCY, consistency, "consistency")
    o.staleness = int(staleness)
    o.partitions = int(partitions)
    o.route = _choice(_ROUTES, route, "route")
    o.nonfinite = _choice(_NONFINITE, nonfinite, "nonfinite policy")
    o.alltoall_split = _choice(_SPLITS, alltoall_split, "alltoall split")
    o.wire_dtype = _choice(_WIRE_DTYPES, wire_dtype, "wire dtype")
    o.prefetch = 1 if prefetch else 0
    o.cache_rows = int(cache_rows)
    o.cache_staleness = int(cache_staleness)
    o.replicas = int(replicas)
    return o


class SparseVariable(_Variable):
    """A rows x dim float32 table held by the daemons (px_register_sparse).

    Options (every worker must give the same): optimizer ("sgd", "adagrad", "adam"), lr,
    beta1, beta2, epsilon, initial_accumulator; initializer ("zeros", "uniform",
    "normal"), seed, init_low, init_high, init_std; aggregation ("sum" or "mean");
    consistency ("sync", "async", "bounded"), staleness; partitions (0: automatic);
    route ("hybrid", the default: "auto" for a sync table, "ps" otherwise; "ps",
    "allgatherv", "allreduce", "alltoall", "auto": the daemons move the table to the route
    their measurements choose); alltoall_split ("rows",
    "columns": how the alltoall route divides the table); nonfinite ("reject", "skip");
    wire_dtype ("f32", or lossy "bf16"/"f16": pulled rows and pushed gradients between
    nodes in 16 bits); prefetch (True: the next pull step may be issued before this push
    step, see prefetch(); a push step may then push only rows its own pull step pulled);
    cache_rows, cache_staleness (a "bounded" table of the ps or hybrid route: each node keeps
    up to cache_rows hot rows of other nodes and serves them for cache_staleness pull steps,
    holding its gradients of them as long; docs/sparse.md, "The hot-row cache");
    replicas (2: each node keeps a copy of the partitions of the node before it, so that a
    lost node's partitions are handed to the job's next run from the copy; membership on
    etcd and a "sync" table; docs/elastic.md, "Sparse tables across a reset"; default 1).
    The n-th pull is pull step n and the n-th push push step n, on every local worker.
    Indices and rows may be CUDA tensors of one device (PX_MEMORY_CUDA, ordered on its
    current torch stream): both inside px_alloc_ex memory, e.g. from
    Client.empty_tensor(..., device="cuda"), indices int64; not on a prefetch table (the
    daemon takes those on the host). parallax.torch's layers stage them so.
    """

    def __init__(self, client: "Client", name: str, rows: int, dim: int, *,
                 optimizer: str = "sgd", lr: Optional[float] = None,
                 beta1: Optional[float] = None, beta2: Optional[float] = None,
                 epsilon: Optional[float] = None, initial_accumulator: Optional[float] = None,
                 initializer: str = "zeros", seed: int = 0, init_low: Optional[float] = None,
                 init_high: Optional[float] = None, init_std: Optional[float] = None,
                 aggregation: str = "sum", consistency: str = "sync", staleness: int = 0,
                 partitions: int = 0, route: str = "hybrid", nonfinite: str = "reject",
                 alltoall_split: str = "rows", wire_dtype: str = "f32",
                 prefetch: bool = False, cache_rows: int = 0, cache_staleness: int = 0,
                 replicas: int = 1):
        super().__init__(client, name)
        self.rows, self.dim = int(rows), int(dim)
        self.options = _sparse_options(
            optimizer=optimizer, lr=lr, beta1=beta1, beta2=beta2, epsilon=epsilon,
            initial_accumulator=initial_accumulator, initializer=initializer, seed=seed,
            init_low=init_low, init_high=init_high, init_std=init_std, aggregation=aggregation,
            consistency=consistency, staleness=staleness, partitions=partitions, route=route,
            nonfinite=nonfinite, alltoall_split=alltoall_split, wire_dtype=wire_dtype,
            prefetch=prefetch, cache_rows=cache_rows, cache_staleness=cache_staleness,
            replicas=replicas)
        self._learning_rate = self.options.learning_rate
        self._register()

    def _register(self) -> None:
        handle = ctypes.c_void_p()
        check(_lib.lib.px_register_sparse(self.client._h(), self.name.encode(), _lib.F32,
                                          self.rows, self.dim, ctypes.byref(self.options),
                                          ctypes.byref(handle)),
              self.client._handle)
        self._handle = handle.value

    def __repr__(self) -> str:
        return f"<parallax.SparseVariable '{self.name}' {self.rows} x {self.dim}>"

    def _rows_op(self, fn, op: str, indices: Any, rows: Any, writable: bool,
                 priority: int = 0) -> Request:
        """A row operation. CUDA tensors (indices and rows on one device, both inside
        px_alloc_ex allocations: Client.empty_tensor(..., device=)) are PX_MEMORY_CUDA,
        ordered on the device's current torch stream; the daemon refuses device rows
        elsewhere, and on a prefetch variable (README, GPUs)."""
        idx = _buffers.as_indices(indices, f"{op} indices of '{self.name}'", cuda_ok=True)
        if rows is None:
            rows = self._new_rows(indices, idx.count)
        buf = _buffers.as_buffer(rows, f"{op} rows of '{self.name}'", writable, cuda_ok=True)
        if buf.dtype != _lib.F32:
            raise invalid(f"{op} rows of '{self.name}' are {_buffers.DTYPE_NAMES[buf.dtype]}; "
                          "sparse variables are float32")
        if buf.count != idx.count * self.dim:
            raise invalid(f"{op} rows of '{self.name}' have {buf.count} values; "
                          f"{idx.count} indices x dim {self.dim} = {idx.count * self.dim} "
                          "expected")
        opts = _op_options(priority)
        if idx.device >= 0 or buf.device >= 0:
            if idx.device != buf.device:
                where = {i.device: str(getattr(i.owner, "device", "host")) for i in (idx, buf)}
                raise invalid(f"{op} of '{self.name}': indices on {where[idx.device]}, rows on "
                              f"{where[buf.device]} (one CUDA device for both, or host "
                              "memory for both)")
            _on_stream(opts, idx.device)
        req = ctypes.c_void_p()
        idx_ptr = ctypes.cast(ctypes.c_void_p(idx.address), ctypes.POINTER(ctypes.c_int64))
        status = fn(self._h(), idx_ptr, idx.count, buf.address, ctypes.byref(opts),
                    ctypes.byref(req))
        return self.client._request(status, req, self._describe(op), rows,
                                    (idx.owner, buf.owner))

    def _new_rows(self, indices: Any, n: int) -> Any:
        if _buffers.is_tensor(indices) or np is None:
            import torch
            # Device rows must be px_alloc_ex memory.
            if _buffers.is_tensor(indices) and indices.device.type == "cuda":
                return self.client.empty_tensor((n, self.dim), torch.float32, indices.device)
            return torch.empty((n, self.dim), dtype=torch.float32)
        return np.empty((n, self.dim), dtype=np.float32)

    def pull(self, indices: Any, out: Any = None, *, priority: int = 0) -> Request:
        """Pull step: the rows' current values into out (n x dim; None: a new array)."""
        return self._rows_op(_lib.lib.px_pull_rows_ex, "pull", indices, out, True, priority)

    def prefetch(self, indices: Any, out: Any = None, *, priority: int = 0) -> Request:
        """The next pull step, issued ahead (px_prefetch_rows; the variable needs
        prefetch=True): typically before this step's push. Its rows no node pulled in this
        step come at once, the others once this step's push is applied: never a stale row."""
        return self._rows_op(_lib.lib.px_prefetch_rows_ex, "prefetch", indices, out, True,
                             priority)

    def push(self, indices: Any, grads: Any, *, priority: int = 0) -> Request:
        """Push step: gradients for the rows (duplicates summed); the daemon applies the
        optimizer. Completes once the daemon has taken them."""
        return self._rows_op(_lib.lib.px_push_rows_ex, "push", indices, grads, False,
                             priority)

    def load(self, indices: Any, rows: Any) -> Request:
        """Overwrites the rows' values (not a step)."""
        return self._rows_op(_lib.lib.px_load_rows_ex, "load", indices, rows, False)

    def read(self, indices: Any, out: Any = None) -> Request:
        """The rows' current values without a step (export, evaluation)."""
        return self._rows_op(_lib.lib.px_read_rows_ex, "read", indices, out, True)

    @property
    def learning_rate(self) -> float:
        """The optimizer's learning rate for this worker's next push step. Setting it
        (px_set_sparse_lr) applies from that step on; every worker must set the same rate
        before the same push step."""
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, rate: float) -> None:
        check(_lib.lib.px_set_sparse_lr(self._h(), float(rate)), self.client._handle)
        self._learning_rate = float(rate)


class SparseTable(SparseVariable):
    """One table of a SparseGroup: a SparseVariable whose indices are the table's own row
    numbers (0 .. rows-1) in every operation. Its steps are steps of the whole group (pull
    it alone, or with other tables in one step through SparseGroup.pull_tables); its
    learning_rate and stats() are the group's."""

    def __init__(self, group: "SparseGroup", table: str, rows: int, offset: int,
                 handle: int):
        _Variable.__init__(self, group.client, group.name)
        self.group, self.table = group, table
        self.rows, self.dim, self.offset = int(rows), group.dim, int(offset)
        self.options = group.options
        self._handle = handle

    def __repr__(self) -> str:
        return (f"<parallax.SparseTable '{self.table}' of group '{self.name}' "
                f"{self.rows} x {self.dim}>")

    def _describe(self, op: str) -> str:
        return f"{op} of table '{self.table}' of '{self.name}' on {self.client.describe()}"

    @property
    def learning_rate(self) -> float:
        return self.group.learning_rate

    @learning_rate.setter
    def learning_rate(self, rate: float) -> None:
        self.group.learning_rate = rate


class SparseGroup(SparseVariable):
    """Tables that take their steps together (px_register_sparse_group, ABI 1.12): the
    daemons hold them as one sparse variable whose rows are the tables' one after another
    (table t's rows start at tables[t].offset), so pull_tables()/push_tables() over several
    tables are one pull or one push step of the group, on every route, as TorchRec's
    EmbeddingBagCollection sends all its tables' rows in one step. The group itself is a
    SparseVariable over those rows (it also takes CUDA tensors, as a variable does);
    group[name] is a table's own SparseTable. tables: (name, rows) pairs, or a dict; the
    options are SparseVariable's, shared by every table."""

    def __init__(self, client: "Client", name: str, tables: Any, dim: int, **options: Any):
        pairs = list(tables.items()) if isinstance(tables, dict) else list(tables)
        if not pairs:
            raise invalid(f"sparse group '{name}': no tables")
        self._layout = [(str(t), int(r)) for t, r in pairs]
        super().__init__(client, name, sum(r for _, r in self._layout), dim, **options)

    def _register(self) -> None:
        n = len(self._layout)
        names = (ctypes.c_char_p * n)(*(t.encode() for t, _ in self._layout))
        rows = (ctypes.c_uint64 * n)(*(r for _, r in self._layout))
        group = ctypes.c_void_p()
        handles = (ctypes.c_void_p * n)()
        check(_lib.lib.px_register_sparse_group(self.client._h(), self.name.encode(), _lib.F32,
                                                n, names, rows, self.dim,
                                                ctypes.byref(self.options),
                                                ctypes.byref(group), handles),
              self.client._handle)
        self._handle = group.value
        self.tables: dict = {}
        offset = 0
        for (table, count), handle in zip(self._layout, handles):
            self.tables[table] = SparseTable(self, table, count, offset, handle)
            offset += count

    def __repr__(self) -> str:
        names = ", ".join(f"{t}: {r}" for t, r in self._layout)
        return f"<parallax.SparseGroup '{self.name}' {{{names}}} x {self.dim}>"

    def __getitem__(self, table: str) -> SparseTable:
        return self.tables[table]

    def _group_op(self, fn, op: str, parts: Sequence, rows: Any, writable: bool,
                  priority: int) -> Request:
        """One step over several tables: parts are (table or its name, indices) pairs, on
        the host; rows (or the new result) hold their rows one after another."""
        tables, counts, chunks = [], [], []
        for table, indices in parts:
            t = self.tables.get(table) if isinstance(table, str) else table
            if not isinstance(t, SparseTable) or t.group is not self:
                raise invalid(f"{op} of '{self.name}': {table!r} is not one of its tables "
                              f"({', '.join(self.tables)})")
            idx = _buffers.as_indices(indices, f"{op} indices of table '{t.table}'")
            tables.append(t._handle)
            counts.append(idx.count)
            chunks.append(idx)
        total = sum(counts)
        index_array = (ctypes.c_int64 * max(1, total))()
        at = 0
        for idx in chunks:
            ctypes.memmove(ctypes.addressof(index_array) + at * 8, idx.address, idx.count * 8)
            at += idx.count
        if rows is None:
            rows = self._new_rows(None if not parts else parts[0][1], total)
        buf = _buffers.as_buffer(rows, f"{op} rows of '{self.name}'", writable)
        if buf.dtype != _lib.F32 or buf.count != total * self.dim:
            raise invalid(f"{op} rows of '{self.name}': {total} x {self.dim} float32 values "
                          f"expected, got {buf.count} of {_buffers.DTYPE_NAMES[buf.dtype]}")
        n = len(tables)
        handles = (ctypes.c_void_p * n)(*tables)
        count_array = (ctypes.c_uint64 * n)(*counts)
        opts = _op_options(priority)
        req = ctypes.c_void_p()
        status = fn(handles, n, count_array, index_array, buf.address, ctypes.byref(opts),
                    ctypes.byref(req))
        return self.client._request(status, req, self._describe(op), rows,
                                    (index_array, buf.owner, [c.owner for c in chunks]))

    def pull_tables(self, parts: Sequence, out: Any = None, *, priority: int = 0) -> Request:
        """One pull step over several tables (px_pull_rows_group): parts are (table,
        indices) pairs, a table by name or SparseTable, repeats allowed; the result holds
        their rows in that order (sum of the counts x dim)."""
        return self._group_op(_lib.lib.px_pull_rows_group, "pull", parts, out, True, priority)

    def prefetch_tables(self, parts: Sequence, out: Any = None, *,
                        priority: int = 0) -> Request:
        """pull_tables issued ahead (px_prefetch_rows_group; the group needs prefetch=True)."""
        return self._group_op(_lib.lib.px_prefetch_rows_group, "prefetch", parts, out, True,
                              priority)

    def push_tables(self, parts: Sequence, grads: Any, *, priority: int = 0) -> Request:
        """One push step over several tables (px_push_rows_group): gradients laid out as
        pull_tables' rows."""
        return self._group_op(_lib.lib.px_push_rows_group, "push", parts, grads, False,
                              priority)
