"""torch tensors viewing memory Parallax allocated (the arena, px_alloc_ex device memory),
through a DLPack capsule built with ctypes: one code path for host and CUDA memory, and no
NumPy (pip's torch 2.x no longer needs it; torch.as_tensor of __cuda_array_interface__
does).

The capsule's deleter, called by torch once the last tensor viewing the memory is gone
(views of views included), drops the owner (an ArenaMemory), which frees the memory.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64, c_uint8,
                    c_uint16, c_uint64, c_void_p)
from typing import Any, Optional, Sequence

KDL_CPU = 1
KDL_CUDA = 2
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT = 0, 1, 2, 4


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32),
                ("dtype", _DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    pass


_Deleter = CFUNCTYPE(None, POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p),
                             ("deleter", _Deleter)]

# address of a _DLManagedTensor -> (it, shape, strides, owner): alive until torch's deleter
_live: dict = {}
_lock = threading.Lock()


def _release(managed) -> None:
    try:
        with _lock:
            _live.pop(ctypes.addressof(managed.contents), None)
    except Exception:  # interpreter shutdown: nothing left to do
        pass


_DELETER = _Deleter(_release)
# Never freed, even at interpreter exit: torch may free a tensor (and call the deleter)
# after this module's globals are gone.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_DELETER))

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [c_void_p, c_char_p, c_void_p]
_CAPSULE_NAME = b"dltensor"  # a module constant: the capsule keeps a pointer to it


def _dl_dtype(dtype) -> _DLDataType:
    torch = sys.modules["torch"]
    table = {torch.float32: (_KDL_FLOAT, 32), torch.float64: (_KDL_FLOAT, 64),
             torch.float16: (_KDL_FLOAT, 16), torch.bfloat16: (_KDL_BFLOAT, 16),
             torch.int64: (_KDL_INT, 64), torch.int32: (_KDL_INT, 32),
             torch.int16: (_KDL_INT, 16), torch.int8: (_KDL_INT, 8),
             torch.uint8: (_KDL_UINT, 8)}
    code, bits = table[dtype]
    return _DLDataType(code, bits, 1)


def tensor_at(address: int, shape: Sequence[int], dtype: Any, owner: Any,
              cuda_device: Optional[int] = None):
    """A contiguous torch tensor of shape and dtype at address (host memory, or CUDA memory
    of device cuda_device as this process numbers it), keeping owner alive as long as any
    tensor shares that memory."""
    from torch.utils import dlpack
    torch = sys.modules["torch"]
    if dtype == torch.bool:  # torch 1.13 takes no DLPack bool: its bytes, viewed
        return tensor_at(address, shape, torch.uint8, owner, cuda_device).view(torch.bool)
    shape = [int(s) for s in shape]
    ndim = len(shape)
    c_shape = (c_int64 * max(1, ndim))(*shape)
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(1, s)
    c_strides = (c_int64 * max(1, ndim))(*reversed(strides))
    m = _DLManagedTensor()
    m.dl_tensor.data = address
    m.dl_tensor.device = (_DLDevice(KDL_CPU, 0) if cuda_device is None
                          else _DLDevice(KDL_CUDA, int(cuda_device)))
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype = _dl_dtype(dtype)
    m.dl_tensor.shape = c_shape
    m.dl_tensor.strides = c_strides
    m.dl_tensor.byte_offset = 0
    m.deleter = _DELETER
    key = ctypes.addressof(m)
    with _lock:
        _live[key] = (m, c_shape, c_strides, owner)
    try:
        return dlpack.from_dlpack(_capsule_new(key, _CAPSULE_NAME, None))
    except BaseException:
        with _lock:
            _live.pop(key, None)
        raise
