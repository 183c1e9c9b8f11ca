"""Turns NumPy arrays and torch tensors into (pointer, dtype, element count) for the C ABI.

Buffers are passed by address, never copied here: they must be C-contiguous (a
non-contiguous array is refused, not silently copied, because an out buffer that is a
copy would never receive the result) and in host memory, except where the operation takes
CUDA memory (allreduce, broadcast, the sparse row operations: a CUDA tensor's Buffer
carries its device; other operations refuse it clearly). torch is imported only if the
caller passes a tensor; NumPy is optional (None here without it), needed only for NumPy
arrays and Python sequences given as indices without torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

try:
    import numpy as np
except ImportError:  # pip's torch 2.x runs without NumPy: so does the torch path here
    np = None

from . import _lib
from .errors import error, invalid

_NUMPY_DTYPES = {} if np is None else {
    np.dtype(np.float32): _lib.F32, np.dtype(np.float64): _lib.F64,
    np.dtype(np.float16): _lib.F16, np.dtype(np.int32): _lib.I32,
    np.dtype(np.int64): _lib.I64,
}
DTYPE_NAMES = {_lib.F32: "float32", _lib.F64: "float64", _lib.F16: "float16",
               _lib.BF16: "bfloat16", _lib.I32: "int32", _lib.I64: "int64"}
DTYPE_SIZES = {_lib.F32: 4, _lib.F64: 8, _lib.F16: 2, _lib.BF16: 2, _lib.I32: 4, _lib.I64: 8}


def _torch_dtypes():
    torch = sys.modules["torch"]
    return {torch.float32: _lib.F32, torch.float64: _lib.F64, torch.float16: _lib.F16,
            torch.bfloat16: _lib.BF16, torch.int32: _lib.I32, torch.int64: _lib.I64}


def dtype_code(dtype: Any) -> int:
    """px_dtype of a NumPy dtype, a torch dtype or a name ("float32", "bf16", ...)."""
    if isinstance(dtype, int):
        if dtype in DTYPE_NAMES:
            return dtype
        raise invalid(f"unknown px_dtype {dtype}")
    if isinstance(dtype, str):
        aliases = {"f32": "float32", "f64": "float64", "f16": "float16", "half": "float16",
                   "bf16": "bfloat16", "i32": "int32", "i64": "int64", "float": "float32",
                   "double": "float64"}
        name = aliases.get(dtype, dtype)
        for code, n in DTYPE_NAMES.items():
            if n == name:
                return code
        raise invalid(f"unsupported dtype '{dtype}' (float32, float64, float16, bfloat16, "
                      "int32, int64)")
    if "torch" in sys.modules and isinstance(dtype, sys.modules["torch"].dtype):
        code = _torch_dtypes().get(dtype)
        if code is None:
            raise invalid(f"unsupported dtype {dtype}")
        return code
    try:
        return _NUMPY_DTYPES[np.dtype(dtype)]
    except (KeyError, TypeError, AttributeError):  # AttributeError: no NumPy
        raise invalid(f"unsupported dtype {dtype}") from None


@dataclass
class Buffer:
    """What an operation passes to the C ABI for one buffer."""
    address: int
    dtype: int
    count: int   # elements
    owner: Any   # kept alive until the operation completes
    device: int = -1  # a CUDA tensor's device index; -1: host memory


def is_tensor(x: Any) -> bool:
    """x is a torch.Tensor (False without importing torch when nobody imported it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def as_buffer(x: Any, what: str, writable: bool, cuda_ok: bool = False) -> Buffer:
    """The buffer behind x (np.ndarray or torch.Tensor). what names it in errors; cuda_ok:
    the operation takes CUDA tensors."""
    if is_tensor(x):
        cuda = x.device.type == "cuda" and cuda_ok
        if x.device.type != "cpu" and not cuda:
            takes = "host memory" + (" or CUDA memory" if cuda_ok else
                                     " here (CUDA tensors: allreduce, broadcast and the sparse "
                                     "row operations only so far)")
            raise error(_lib.ERR_INVALID,
                        f"{what} is a {x.device.type} tensor ({x.device}); Parallax needs "
                        f"{takes} (README, Limits): move it with .cpu() or allocate it "
                        "with Client.empty()")
        if not x.is_contiguous():
            raise invalid(f"{what} is not contiguous (strides {tuple(x.stride())}); pass "
                          ".contiguous() and copy the result back")
        code = _torch_dtypes().get(x.dtype)
        if code is None:
            raise invalid(f"{what} has unsupported dtype {x.dtype}")
        if writable and x.requires_grad and x.is_leaf:
            # Writing into a leaf that autograd tracks would bypass it; Horovod and DDP
            # write under torch.no_grad() too. The caller's x.data is the way.
            raise invalid(f"{what} requires grad; pass tensor.data or use torch.no_grad()")
        return Buffer(x.data_ptr(), code, x.numel(), x, x.device.index if cuda else -1)
    if np is not None and isinstance(x, np.ndarray):
        if not x.flags["C_CONTIGUOUS"]:
            raise invalid(f"{what} is not C-contiguous (strides {x.strides}); pass "
                          "np.ascontiguousarray(...) and copy the result back")
        if writable and not x.flags["WRITEABLE"]:
            raise invalid(f"{what} is read-only")
        code = _NUMPY_DTYPES.get(x.dtype)
        if code is None:
            raise invalid(f"{what} has unsupported dtype {x.dtype}")
        return Buffer(x.ctypes.data, code, x.size, x)
    raise invalid(f"{what} must be a numpy.ndarray or torch.Tensor, not {type(x).__name__}")


def as_indices(x: Any, what: str = "indices", cuda_ok: bool = False) -> Buffer:
    """Row indices as int64 (a copy is made from other integer types: indices are only
    read, and the copy is kept alive with the request). cuda_ok: CUDA tensors are taken as
    they are (int64 and contiguous, since a copy would leave the px_alloc_ex memory the
    daemon's device steps need); the Buffer carries their device."""
    if is_tensor(x):
        torch = sys.modules["torch"]
        cuda = x.device.type == "cuda" and cuda_ok
        if x.device.type != "cpu" and not cuda:
            raise error(_lib.ERR_INVALID,
                        f"{what} is a {x.device.type} tensor ({x.device}); Parallax needs "
                        "host memory" + (" or CUDA memory" if cuda_ok else " here"))
        if x.dtype.is_floating_point:
            raise invalid(f"{what} must be integers, not {x.dtype}")
        if cuda and (x.dtype != torch.int64 or not x.is_contiguous()):
            raise invalid(f"{what} on {x.device} must be contiguous int64 (in px_alloc_ex "
                          f"memory: Client.empty_tensor(n, torch.int64, device=...)), not "
                          f"{x.dtype}{'' if x.is_contiguous() else ', strided'}")
        if x.dtype != torch.int64 or not x.is_contiguous():
            x = x.to(torch.int64).contiguous()
        return Buffer(x.data_ptr(), _lib.I64, x.numel(), x, x.device.index if cuda else -1)
    if np is None:
        if "torch" in sys.modules:  # a list or tuple, without NumPy: through torch
            return as_indices(sys.modules["torch"].as_tensor(x, dtype=sys.modules[
                "torch"].int64), what)
        raise invalid(f"{what}: pass a torch tensor (NumPy is not installed)")
    x = np.asarray(x)
    if x.dtype.kind not in "iu":
        raise invalid(f"{what} must be integers, not {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.int64)
    return Buffer(x.ctypes.data, _lib.I64, x.size, x)
