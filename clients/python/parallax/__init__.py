"""Parallax from Python: a client of the node's parallaxd over the C ABI (ctypes).

    import parallax
    with parallax.Client() as px:                      # settings from PARALLAX_*/torchrun/Slurm
        grad = px.empty(1024)                          # a NumPy array in the shared arena
        var = px.dense("grad", 1024, "float32", op="mean")
        var.allreduce(grad).wait()                     # in place, zero copies

`parallax.torch` adds the PyTorch integration (DDP-style wrapper, sparse Embedding).
"""

from ._lib import ABI_MAJOR, ABI_MINOR, library_path
from ._version import __version__
from .client import ArenaMemory, Client, World, resolve_settings
from .errors import (Busy, Cancelled, ConnectError, DeadlineExceeded, InternalError,
                     InvalidArgument, MembershipChanged, Mismatch, NotFound,
                     NotImplementedInParallax, OutOfMemory, ParallaxError, PeerLost,
                     PermissionDenied, ProtocolError, RowIndexError, VersionMismatch)
from .request import Request, wait_all
from .variables import DenseVariable, SparseGroup, SparseTable, SparseVariable, Stats

# The C ABI this package binds (the header's major.minor; the library loaded may be a later
# 1.x): a number apart from __version__, the package's.
abi_version = f"{ABI_MAJOR}.{ABI_MINOR}"

__all__ = [
    "__version__", "abi_version", "ABI_MAJOR", "ABI_MINOR", "library_path", "ArenaMemory",
    "Client", "World", "resolve_settings", "Request", "wait_all", "DenseVariable",
    "SparseVariable", "SparseGroup", "SparseTable", "Stats",
    "ParallaxError", "InvalidArgument", "VersionMismatch", "ConnectError", "DeadlineExceeded",
    "PeerLost", "Mismatch", "NotFound", "OutOfMemory", "Busy", "ProtocolError",
    "RowIndexError", "NotImplementedInParallax", "InternalError", "PermissionDenied",
    "Cancelled", "MembershipChanged",
]
