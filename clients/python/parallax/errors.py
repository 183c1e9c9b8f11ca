"""Exceptions: every failure carries the C status, its enum name and the whole message.

Each status has its own class, and the classes also derive from the nearest built-in
exception, so `except TimeoutError` or `except IndexError` work as a Python user expects.
"""

from __future__ import annotations

from . import _lib


class ParallaxError(Exception):
    """A failed Parallax call or operation.

    status: the px_status value; status_name: its name ("PX_ERR_TIMEOUT");
    message: the library's or daemon's message (names node, worker, variable and step
    where the daemon knows them).
    """

    status: int = -1

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = _lib.status_name(status)
        self.message = message or _lib.strerror(status)
        super().__init__(f"{self.status_name}: {self.message}")


class InvalidArgument(ParallaxError, ValueError):
    """PX_ERR_INVALID: a bad argument (dtype, shape, non-contiguous or CUDA tensor, ...)."""


class VersionMismatch(ParallaxError):
    """PX_ERR_VERSION: client and daemon ABIs are incompatible."""


class ConnectError(ParallaxError, ConnectionError):
    """PX_ERR_CONNECT: the daemon could not be reached or refused the connection."""


class DeadlineExceeded(ParallaxError, TimeoutError):
    """PX_ERR_TIMEOUT: a deadline passed (a wait, or a step some worker never joined)."""


class PeerLost(ParallaxError, ConnectionError):
    """PX_ERR_PEER_LOST: another worker, node or this node's daemon is gone."""


class MembershipChanged(PeerLost):
    """PX_ERR_MEMBERSHIP: nodes joined the cluster (membership on etcd), so this run of the
    job ended; connect again and re-read the world (parallax.elastic.run does both). A
    PeerLost, as joins were before ABI 1.15, so code that catches PeerLost goes on working."""


class Mismatch(ParallaxError, ValueError):
    """PX_ERR_MISMATCH: the variable was registered elsewhere with another shape/type/op."""


class NotFound(ParallaxError, LookupError):
    """PX_ERR_NOT_FOUND: unknown variable, or a handle used after its client closed."""


class OutOfMemory(ParallaxError, MemoryError):
    """PX_ERR_NO_MEMORY: the shared-memory arena (or the daemon) is full."""


class Busy(ParallaxError):
    """PX_ERR_BUSY: too many requests in flight on this client."""


class ProtocolError(ParallaxError):
    """PX_ERR_PROTOCOL: a malformed message between client and daemon."""


class RowIndexError(ParallaxError, IndexError):
    """PX_ERR_INDEX: a sparse row index outside [0, rows)."""


class NotImplementedInParallax(ParallaxError, NotImplementedError):
    """PX_ERR_NOT_IMPLEMENTED: listed in the README's limits (e.g. CUDA memory)."""


class InternalError(ParallaxError):
    """PX_ERR_INTERNAL: a bug; please report it with the daemon's log."""


class PermissionDenied(ParallaxError, PermissionError):
    """PX_ERR_PERMISSION: the daemon refused this process's credentials."""


class Cancelled(ParallaxError):
    """PX_ERR_CANCELLED: the request was cancelled, or freed/closed during a wait."""


_BY_STATUS = {
    _lib.ERR_INVALID: InvalidArgument, _lib.ERR_VERSION: VersionMismatch,
    _lib.ERR_CONNECT: ConnectError, _lib.ERR_TIMEOUT: DeadlineExceeded,
    _lib.ERR_PEER_LOST: PeerLost, _lib.ERR_MISMATCH: Mismatch, _lib.ERR_NOT_FOUND: NotFound,
    _lib.ERR_NO_MEMORY: OutOfMemory, _lib.ERR_BUSY: Busy, _lib.ERR_PROTOCOL: ProtocolError,
    _lib.ERR_INDEX: RowIndexError, _lib.ERR_NOT_IMPLEMENTED: NotImplementedInParallax,
    _lib.ERR_INTERNAL: InternalError, _lib.ERR_PERMISSION: PermissionDenied,
    _lib.ERR_CANCELLED: Cancelled, _lib.ERR_MEMBERSHIP: MembershipChanged,
}


def error(status: int, message: str) -> ParallaxError:
    """The exception for a status, of its own class."""
    return _BY_STATUS.get(status, ParallaxError)(status, message)


def invalid(message: str) -> InvalidArgument:
    """An argument refused in Python before any call (same class as the C library's)."""
    return InvalidArgument(_lib.ERR_INVALID, message)


def check(status: int, client_handle=None) -> None:
    """Raises for a failed call. The message comes from the client (any thread) when there
    is one, else from this thread's px_last_error, read before anything else is called."""
    if status == _lib.OK:
        return
    message = _lib.lib.px_last_error().decode(errors="replace")
    if client_handle is not None and not message:
        message = client_last_error(client_handle)
    raise error(status, message)


def client_last_error(handle) -> str:
    import ctypes
    length = ctypes.c_uint64(0)
    buf = ctypes.create_string_buffer(1024)
    if _lib.lib.px_client_last_error(handle, buf, len(buf), ctypes.byref(length)) != _lib.OK:
        return ""
    if length.value >= len(buf):
        buf = ctypes.create_string_buffer(length.value + 1)
        _lib.lib.px_client_last_error(handle, buf, len(buf), ctypes.byref(length))
    return buf.value.decode(errors="replace")
