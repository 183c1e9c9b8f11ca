"""ctypes declarations of the C ABI (include/parallax_c.h, ABI 1.9), checked against the
header by clients/check_bindings.py (ctest clients/python-bindings-match-header).

The package binds the C library only: nothing here knows the daemon's protocol. The
library is found, in order: inside the package (a wheel carries parallax/libparallax.so.1),
at $PARALLAX_LIB, next to an installed package (PREFIX/lib/libparallax.so.1 for
PREFIX/lib/python3*/dist-packages/parallax), by the dynamic loader's search
("libparallax.so.1"), and last, in a source checkout, the default build directory's
(build/clients/c/libparallax.so.1).
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_uint32, c_uint64, c_void_p)

ABI_MAJOR = 1
ABI_MINOR = 16
ABI_VERSION = (ABI_MAJOR << 16) | ABI_MINOR

ARENA_MIN_BYTES = 1 << 20
ARENA_MAX_BYTES = 16 << 30

# px_status
OK = 0
ERR_INVALID = 1
ERR_VERSION = 2
ERR_CONNECT = 3
ERR_TIMEOUT = 4
ERR_PEER_LOST = 5
ERR_MISMATCH = 6
ERR_NOT_FOUND = 7
ERR_NO_MEMORY = 8
ERR_BUSY = 9
ERR_PROTOCOL = 10
ERR_INDEX = 11
ERR_NOT_IMPLEMENTED = 12
ERR_INTERNAL = 13
ERR_PERMISSION = 14
ERR_CANCELLED = 15
ERR_MEMBERSHIP = 16

# px_dtype
F32, F64, F16, BF16, I32, I64 = range(6)
# px_reduce_op
SUM, MEAN, MIN, MAX, PROD = range(5)
# px_memory_kind
MEMORY_HOST, MEMORY_CUDA = range(2)
# px_optimizer, px_initializer, px_consistency, px_route, px_nonfinite, px_split
OPT_SGD, OPT_ADAGRAD, OPT_ADAM = range(3)
INIT_ZEROS, INIT_UNIFORM, INIT_NORMAL = range(3)
SYNC, ASYNC, BOUNDED = range(3)
ROUTE_HYBRID, ROUTE_PS, ROUTE_ALLGATHERV, ROUTE_ALLREDUCE, ROUTE_ALLTOALL, ROUTE_AUTO = range(6)
NONFINITE_REJECT, NONFINITE_SKIP = range(2)
SPLIT_ROWS, SPLIT_COLUMNS = range(2)


class ConnectOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("abi_version", c_uint32),
                ("socket_path", c_char_p), ("job_name", c_char_p),
                ("local_rank", c_int32), ("local_size", c_int32),
                ("timeout_ms", c_int64), ("arena_bytes", c_uint64),
                ("wait_for_daemon", c_int32), ("reserved", c_uint32)]


class LaunchInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("local_rank", c_int32), ("local_size", c_int32),
                ("rank", c_int32), ("launcher", c_char_p), ("job_name", c_char_p),
                ("socket_path", c_char_p)]


class OpOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("memory_kind", c_int32), ("device", c_int32),
                ("priority", c_int32), ("stream", c_void_p), ("root", c_int32),
                ("reserved", c_uint32)]


class AllocOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("memory_kind", c_int32), ("device", c_int32),
                ("reserved", c_uint32)]


class WorldInfo(Structure):
    _fields_ = [("struct_size", c_uint32), ("node_index", c_int32), ("node_count", c_int32),
                ("rank", c_int32), ("world_size", c_int32), ("local_rank", c_int32),
                ("local_size", c_int32)]


class VarStats(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("ops", c_uint64),
                ("bytes", c_uint64), ("wait_ns", c_uint64), ("reduce_ns", c_uint64),
                ("pull_steps", c_uint64), ("push_steps", c_uint64),
                ("rows_pulled", c_uint64), ("rows_unique", c_uint64),
                ("rows_applied", c_uint64), ("bytes_sent", c_uint64),
                ("bytes_received", c_uint64), ("request_partitions", c_uint64),
                ("search_steps_left", c_uint64), ("restored_steps", c_uint64),
                ("rows_served_ahead", c_uint64), ("cache_hits", c_uint64),
                ("cache_misses", c_uint64), ("cache_rows", c_uint64),
                ("cache_bytes_saved", c_uint64), ("cache_rows_flushed", c_uint64)]


class DenseOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("wire_dtype", c_int32)]


class SparseOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("optimizer", c_int32),
                ("learning_rate", c_double), ("beta1", c_double), ("beta2", c_double),
                ("epsilon", c_double), ("initial_accumulator", c_double),
                ("initializer", c_int32), ("reserved0", c_uint32), ("init_seed", c_uint64),
                ("init_low", c_double), ("init_high", c_double), ("init_std", c_double),
                ("aggregation", c_int32), ("consistency", c_int32), ("staleness", c_uint32),
                ("partitions", c_uint32), ("route", c_int32), ("nonfinite", c_int32),
                ("alltoall_split", c_int32), ("wire_dtype", c_int32), ("prefetch", c_uint32),
                ("reserved1", c_uint32), ("cache_rows", c_uint32), ("cache_staleness", c_uint32),
                ("replicas", c_uint32), ("reserved2", c_uint32)]


_P = c_void_p  # opaque handles travel as void*
_PP = POINTER(c_void_p)
_I64P = POINTER(c_int64)

# name: (restype, argtypes). px_status is returned as int.
_SIGNATURES = {
    "px_abi_version": (c_uint32, []),
    "px_strerror": (c_char_p, [c_int]),
    "px_status_name": (c_char_p, [c_int]),
    "px_last_error": (c_char_p, []),
    "px_connect_options_init_abi": (None, [POINTER(ConnectOptions), c_uint32]),
    "px_connect": (c_int, [POINTER(ConnectOptions), _PP]),
    "px_launch_info_from_env": (c_int, [POINTER(LaunchInfo)]),
    "px_disconnect": (c_int, [_P]),
    "px_world": (c_int, [_P, POINTER(WorldInfo)]),
    "px_client_last_error": (c_int, [_P, POINTER(c_char), c_uint64, POINTER(c_uint64)]),
    "px_abort": (c_int, [_P, c_char_p]),
    "px_client_fd": (c_int, [_P, POINTER(c_int)]),
    "px_progress": (c_int, [_P]),
    "px_register_dense": (c_int, [_P, c_char_p, c_int, c_uint64, c_int, _PP]),
    "px_dense_options_init": (None, [POINTER(DenseOptions)]),
    "px_register_dense_ex": (c_int, [_P, c_char_p, c_int, c_uint64, c_int,
                                     POINTER(DenseOptions), _PP]),
    "px_var_stats_get": (c_int, [_P, POINTER(VarStats)]),
    "px_set_sparse_lr": (c_int, [_P, c_double]),
    "px_sparse_options_init": (None, [POINTER(SparseOptions)]),
    "px_register_sparse": (c_int, [_P, c_char_p, c_int, c_uint64, c_uint64,
                                   POINTER(SparseOptions), _PP]),
    "px_register_sparse_group": (c_int, [_P, c_char_p, c_int, c_uint64, POINTER(c_char_p),
                                         POINTER(c_uint64), c_uint64, POINTER(SparseOptions),
                                         _PP, POINTER(c_void_p)]),
    "px_alloc": (c_int, [_P, c_uint64, _PP]),
    "px_free": (c_int, [_P, _P]),
    "px_alloc_options_init": (None, [POINTER(AllocOptions)]),
    "px_alloc_ex": (c_int, [_P, c_uint64, POINTER(AllocOptions), _PP]),
    "px_op_options_init": (None, [POINTER(OpOptions)]),
    "px_allreduce_ex": (c_int, [_P, _P, _P, POINTER(OpOptions), _PP]),
    "px_broadcast_ex": (c_int, [_P, _P, _P, POINTER(OpOptions), _PP]),
    "px_allgather_ex": (c_int, [_P, _P, _P, POINTER(OpOptions), _PP]),
    "px_allgatherv_ex": (c_int, [_P, _P, POINTER(c_uint64), _P, POINTER(OpOptions), _PP]),
    "px_reduce_scatter_ex": (c_int, [_P, _P, _P, POINTER(OpOptions), _PP]),
    "px_alltoall_ex": (c_int, [_P, _P, _P, POINTER(OpOptions), _PP]),
    "px_alltoallv_ex": (c_int, [_P, _P, POINTER(c_uint64), _P, POINTER(c_uint64),
                                POINTER(OpOptions), _PP]),
    "px_checkpoint": (c_int, [_P, c_char_p, c_int64]),
    "px_pull_rows_ex": (c_int, [_P, _I64P, c_uint64, _P, POINTER(OpOptions), _PP]),
    "px_prefetch_rows_ex": (c_int, [_P, _I64P, c_uint64, _P, POINTER(OpOptions), _PP]),
    "px_push_rows_ex": (c_int, [_P, _I64P, c_uint64, _P, POINTER(OpOptions), _PP]),
    "px_load_rows_ex": (c_int, [_P, _I64P, c_uint64, _P, POINTER(OpOptions), _PP]),
    "px_read_rows_ex": (c_int, [_P, _I64P, c_uint64, _P, POINTER(OpOptions), _PP]),
    "px_pull_rows_group": (c_int, [POINTER(c_void_p), c_uint64, POINTER(c_uint64), _I64P, _P,
                                   POINTER(OpOptions), _PP]),
    "px_prefetch_rows_group": (c_int, [POINTER(c_void_p), c_uint64, POINTER(c_uint64), _I64P,
                                       _P, POINTER(OpOptions), _PP]),
    "px_push_rows_group": (c_int, [POINTER(c_void_p), c_uint64, POINTER(c_uint64), _I64P, _P,
                                   POINTER(OpOptions), _PP]),
    "px_wait": (c_int, [_P, c_int64]),
    "px_test": (c_int, [_P, POINTER(c_int32)]),
    "px_wait_all": (c_int, [POINTER(c_void_p), c_uint64, c_int64]),
    "px_request_free": (c_int, [_P]),
    "px_request_error": (c_char_p, [_P]),
    "px_request_cancel": (c_int, [_P]),
    "px_barrier": (c_int, [_P, c_int64]),
}


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "libparallax.so.1")
    if os.path.exists(packaged):
        return [packaged]
    env = os.environ.get("PARALLAX_LIB")
    if env:
        return [env]
    # PREFIX/lib/python3.X/dist-packages/parallax -> PREFIX/lib
    installed = os.path.normpath(os.path.join(here, "..", "..", "..", "libparallax.so.1"))
    # In a source checkout (clients/python/parallax), the default build directory's library.
    source_build = os.path.normpath(os.path.join(here, "..", "..", "..", "build", "clients",
                                                 "c", "libparallax.so.1"))
    return [installed, "libparallax.so.1", source_build]


def _load():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        version = lib.px_abi_version()
        if version >> 16 != ABI_MAJOR or (version & 0xFFFF) < ABI_MINOR:
            raise ImportError(f"parallax: {path} has ABI {version >> 16}.{version & 0xFFFF}; "
                              f"this package needs {ABI_MAJOR}.{ABI_MINOR} or a later 1.x")
        return lib, path
    raise ImportError("parallax: cannot load libparallax.so.1 (set PARALLAX_LIB to its path): "
                      + "; ".join(errors))


lib, library_path = _load()


def status_name(status: int) -> str:
    return lib.px_status_name(status).decode()


def strerror(status: int) -> str:
    return lib.px_strerror(status).decode()
