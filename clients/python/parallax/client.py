"""Client: a connection to this node's parallaxd."""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from . import _buffers, _lib
from ._buffers import np  # None where NumPy is not installed (the torch-only paths)
from .errors import check, invalid
from .request import AsyncWaiter, Request

Shape = Union[int, Sequence[int]]


@dataclass(frozen=True)
class World:
    node_index: int
    node_count: int
    rank: int
    world_size: int
    local_rank: int
    local_size: int


def resolve_settings(socket: Optional[str] = None, job: Optional[str] = None,
                     local_rank: Optional[int] = None,
                     local_size: Optional[int] = None) -> dict:
    """The connection settings Client would use: explicit arguments, else the environment as
    libparallax reads it (px_launch_info_from_env: PARALLAX_*, else torchrun's, Open MPI's
    or Slurm's variables), else None (socket, job) / -1 (local_rank) / 0 (local_size) for the
    library's defaults. Also "launcher" (the one found, or "") and "rank" (its global rank,
    or -1). Raises InvalidArgument for a variable the rules cannot use."""
    info = _lib.LaunchInfo()
    info.struct_size = ctypes.sizeof(info)
    check(_lib.lib.px_launch_info_from_env(ctypes.byref(info)))
    if socket is None:
        socket = info.socket_path.decode() or None
    if job is None:
        job = info.job_name.decode() or None
    return {"socket": socket, "job": job,
            "local_rank": info.local_rank if local_rank is None else local_rank,
            "local_size": info.local_size if local_size is None else local_size,
            "launcher": info.launcher.decode(), "rank": info.rank}


class ArenaMemory:
    """A block of memory shared with the daemon, freed (px_free) when the last view of it
    is gone: the arena (px_alloc) or, with cuda_device, CUDA device memory of that device
    (px_alloc_ex with PX_MEMORY_CUDA: whole 2 MiB units, mapped by the daemon once). Views
    must not be used after their client is closed."""

    def __init__(self, client: "Client", nbytes: int, cuda_device: Optional[int] = None):
        ptr = ctypes.c_void_p()
        if cuda_device is None:
            status = _lib.lib.px_alloc(client._h(), max(1, nbytes), ctypes.byref(ptr))
        else:
            options = _lib.AllocOptions()
            _lib.lib.px_alloc_options_init(ctypes.byref(options))
            options.memory_kind = _lib.MEMORY_CUDA
            options.device = int(cuda_device)
            status = _lib.lib.px_alloc_ex(client._h(), max(1, nbytes), ctypes.byref(options),
                                          ctypes.byref(ptr))
        check(status, client._handle)
        self._client = client
        self.address = ptr.value
        self.nbytes = nbytes
        self.cuda_device = cuda_device

    def numpy(self, shape: Shape, dtype: Any) -> "np.ndarray":
        """A NumPy array of shape and dtype over the block (host memory only)."""
        if np is None:
            raise invalid("NumPy is not installed: use Client.empty_tensor for arena memory")
        if self.cuda_device is not None:
            raise invalid("a NumPy array cannot view CUDA memory: use Client.empty_tensor")
        raw = (ctypes.c_uint8 * max(1, self.nbytes)).from_address(self.address)
        raw._parallax_owner = self  # the ndarray's base chain keeps this block alive
        flat = np.frombuffer(raw, dtype=np.uint8, count=self.nbytes)
        return flat.view(dtype).reshape(shape)

    def __del__(self) -> None:
        client = getattr(self, "_client", None)  # None: the allocation itself failed
        if client is not None and client._handle is not None:
            try:
                _lib.lib.px_free(client._handle, self.address)
            except Exception:
                pass


class Client:
    """A worker's connection to its node's parallaxd (px_connect).

    Arguments left None come from the environment (see resolve_settings). timeout is the
    connect/control deadline in seconds; op_timeout the default deadline of Request.wait.
    Use as a context manager, or call close().
    """

    def __init__(self, socket: Optional[str] = None, job: Optional[str] = None, *,
                 local_rank: Optional[int] = None, local_size: Optional[int] = None,
                 timeout: float = 30.0, op_timeout: float = 300.0,
                 arena_bytes: Optional[int] = None, wait_for_daemon: Optional[bool] = None):
        # Arguments left None stay unset: libparallax reads the environment for them
        # (resolve_settings shows what it finds) and warns of a launcher's differing rank.
        options = _lib.ConnectOptions()
        # As this package's ABI version: the daemon tells it the statuses it knows.
        _lib.lib.px_connect_options_init_abi(ctypes.byref(options), _lib.ABI_VERSION)
        self._socket_bytes = socket.encode() if socket else None
        self._job_bytes = job.encode() if job else None
        options.socket_path = self._socket_bytes
        options.job_name = self._job_bytes
        if local_rank is not None:
            options.local_rank = local_rank
        if local_size is not None:
            options.local_size = local_size
        options.timeout_ms = int(timeout * 1000)
        if arena_bytes is not None:
            options.arena_bytes = arena_bytes
        if wait_for_daemon is not None:
            options.wait_for_daemon = 1 if wait_for_daemon else 0
        handle = ctypes.c_void_p()
        self._handle: Optional[int] = None
        check(_lib.lib.px_connect(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle.value
        self.op_timeout = op_timeout
        self.timeout = timeout
        self.world = self._world()
        self._waiters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._fd: Optional[int] = None
        self._variables: dict = {}

    # --- lifetime ---------------------------------------------------------------------
    def _h(self) -> int:
        if self._handle is None:
            raise invalid("the client is closed")
        return self._handle

    def close(self) -> None:
        """Disconnects (px_disconnect): this worker's pending operations fail on the others.
        Arena views (Client.empty) must not be touched afterwards."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _lib.lib.px_disconnect(handle)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def describe(self) -> str:
        w = self.world
        return f"node {w.node_index}, rank {w.rank} (local {w.local_rank})"

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else self.describe()
        return f"<parallax.Client {state} of {self.world.world_size}>"

    # --- the job --------------------------------------------------------------------
    def _world(self) -> World:
        info = _lib.WorldInfo()
        info.struct_size = ctypes.sizeof(info)
        check(_lib.lib.px_world(self._h(), ctypes.byref(info)), self._handle)
        return World(info.node_index, info.node_count, info.rank, info.world_size,
                     info.local_rank, info.local_size)

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size

    @property
    def local_rank(self) -> int:
        return self.world.local_rank

    def barrier(self, timeout: Optional[float] = None) -> None:
        """Returns once every worker of the job, on every node, entered the barrier."""
        timeout = self.op_timeout if timeout is None else timeout
        check(_lib.lib.px_barrier(self._h(), int(timeout * 1000)), self._handle)

    def abort(self, reason: str) -> None:
        """Fails the job on every node at once (px_abort)."""
        check(_lib.lib.px_abort(self._h(), reason.encode()), self._handle)

    def checkpoint(self, path: Union[str, os.PathLike], timeout: Optional[float] = None) -> None:
        """Writes every sparse variable of the job to the directory path (px_checkpoint)."""
        ms = 0 if timeout is None else int(timeout * 1000)
        check(_lib.lib.px_checkpoint(self._h(), os.fsencode(path), ms), self._handle)

    # --- shared memory ----------------------------------------------------------------
    def empty(self, shape: Shape, dtype: Any = "float32") -> "np.ndarray":
        """An uninitialised NumPy array in the shared arena: operations on it need no copy."""
        if np is None:
            raise invalid("Client.empty needs NumPy, which is not installed: use "
                          "Client.empty_tensor")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        return ArenaMemory(self, nbytes).numpy(shape, dtype)

    def zeros(self, shape: Shape, dtype: Any = "float32") -> "np.ndarray":
        """A NumPy array of zeros in the shared arena (empty(), then filled)."""
        a = self.empty(shape, dtype)
        a.fill(0)
        return a

    def empty_tensor(self, shape: Shape, dtype: Any = None, device: Any = None):
        """An uninitialised torch tensor (bfloat16 included) in memory shared with the
        daemon, so operations on it need no copy: the arena for device None or "cpu"; for a
        CUDA device ("cuda" is the current one, "cuda:1", a torch.device) device memory
        from px_alloc_ex with PX_MEMORY_CUDA (whole 2 MiB units), which sparse steps on
        device memory need. Freed once no tensor views it; not to be used after close()."""
        import torch

        from ._dlpack import tensor_at
        dtype = torch.float32 if dtype is None else dtype
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        device = torch.device("cpu" if device is None else device)
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
        elif device.type == "cpu":
            index = None
        else:
            raise invalid(f"empty_tensor: device {device}; Parallax allocates host (cpu) or "
                          "CUDA memory")
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        memory = ArenaMemory(self, nbytes, index)
        return tensor_at(memory.address, shape, dtype, memory, index)

    # --- variables --------------------------------------------------------------------
    def dense(self, name: str, count: Shape, dtype: Any = "float32",
              op: str = "sum", wire_dtype: str = "f32") -> "DenseVariable":
        """Registers a dense variable (px_register_dense_ex); every worker must do the same.
        wire_dtype "bf16" or "f16" carries a float32 allreduce's sums between nodes in 16
        bits (lossy; DenseVariable)."""
        from .variables import DenseVariable
        return DenseVariable(self, name, count, dtype, op, wire_dtype)

    def sparse(self, name: str, rows: int, dim: int, **options: Any) -> "SparseVariable":
        """Registers a sparse table of rows x dim float32 held by the daemons
        (px_register_sparse). Options: see SparseVariable."""
        from .variables import SparseVariable
        return SparseVariable(self, name, rows, dim, **options)

    def sparse_group(self, name: str, tables: Any, dim: int,
                     **options: Any) -> "SparseGroup":
        """Registers tables that take their steps together, held by the daemons as one
        sparse variable (px_register_sparse_group): tables are (name, rows) pairs or a
        dict, every table dim wide with the same options (SparseVariable's)."""
        from .variables import SparseGroup
        return SparseGroup(self, name, tables, dim, **options)

    # --- completion -------------------------------------------------------------------
    def fileno(self) -> int:
        """The completion fd (px_client_fd): readable when a request may have completed."""
        if self._fd is None:
            fd = ctypes.c_int(-1)
            check(_lib.lib.px_client_fd(self._h(), ctypes.byref(fd)), self._handle)
            self._fd = fd.value
        return self._fd

    def progress(self) -> None:
        """Takes posted completions without blocking (px_progress)."""
        check(_lib.lib.px_progress(self._h()), self._handle)

    def _async_waiter(self) -> AsyncWaiter:
        loop = asyncio.get_running_loop()
        waiter = self._waiters.get(loop)
        if waiter is None:
            waiter = AsyncWaiter(self, loop)
            self._waiters[loop] = waiter
        return waiter

    def _request(self, status: int, handle: ctypes.c_void_p, what: str, result: Any,
                 keepalive: tuple) -> Request:
        check(status, self._handle)
        return Request(self, handle.value, what, result, keepalive)
