"""Requests: one submitted operation, waited for from a thread or from asyncio."""

from __future__ import annotations

import asyncio
import ctypes
import time
from typing import TYPE_CHECKING, Any, Iterable, Optional

from . import _lib
from .errors import Cancelled, DeadlineExceeded, ParallaxError, check, error

if TYPE_CHECKING:
    from .client import Client

# px_wait runs in slices so that a blocked wait still sees Ctrl-C (ctypes releases the
# GIL during the call, but a C wait cannot be interrupted by Python's signal handler).
_WAIT_SLICE_S = 0.25


class Request:
    """An operation in flight. wait() returns its result (the out buffer, or None) or
    raises the operation's error. Dropping an incomplete request cancels it first, so
    nothing is written into a buffer after Python let go of it."""

    def __init__(self, client: "Client", handle: int, what: str, result: Any,
                 keepalive: tuple):
        self._client = client
        self._handle: Optional[int] = handle
        self._what = what
        self._result = result
        self._keepalive = keepalive
        self._outcome: Optional[BaseException] = None
        self._done = False

    def __repr__(self) -> str:
        state = "done" if self._done else ("freed" if self._handle is None else "pending")
        return f"<parallax.Request {self._what} {state}>"

    @property
    def what(self) -> str:
        return self._what

    def _finish(self, status: int) -> None:
        self._done = True
        if status != _lib.OK:
            message = _lib.lib.px_request_error(self._handle).decode(errors="replace")
            self._outcome = error(status, message or f"{self._what} failed")
        self._release()

    def _release(self) -> None:
        if self._handle is not None:
            _lib.lib.px_request_free(self._handle)
            self._handle = None
        self._keepalive = ()

    def _outcome_or_result(self) -> Any:
        if self._outcome is not None:
            raise self._outcome
        return self._result

    def test(self) -> bool:
        """True once the operation completed (successfully or not); never blocks."""
        if self._done:
            return True
        if self._handle is None:
            raise Cancelled(_lib.ERR_CANCELLED, f"{self._what}: request was freed")
        done = ctypes.c_int32(0)
        status = _lib.lib.px_test(self._handle, ctypes.byref(done))
        if done.value:
            self._finish(status)
            return True
        check(status)
        return False

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Waits at most timeout seconds (None: the client's op_timeout; every wait has a
        deadline) and returns the result, or raises: DeadlineExceeded on the deadline (the
        request stays valid and can be waited for again), the operation's own error else."""
        if self._done:
            return self._outcome_or_result()
        if self._handle is None:
            raise Cancelled(_lib.ERR_CANCELLED, f"{self._what}: request was freed")
        timeout = self._client.op_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            slice_ms = int(max(0.0, min(left, _WAIT_SLICE_S)) * 1000)
            status = _lib.lib.px_wait(self._handle, slice_ms)
            if status != _lib.ERR_TIMEOUT:
                self._finish(status)
                return self._outcome_or_result()
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(_lib.ERR_TIMEOUT,
                                       f"{self._what}: not complete after {timeout:g} s "
                                       f"({self._client.describe()})")

    def cancel(self) -> None:
        """Cancels the request (see px_request_cancel): once this returns, nothing writes
        its out buffer; a later wait() raises Cancelled."""
        if self._done or self._handle is None:
            return
        status = _lib.lib.px_request_cancel(self._handle)
        check(status)
        self._done = True
        self._outcome = Cancelled(_lib.ERR_CANCELLED, f"{self._what}: cancelled")
        self._release()

    def __del__(self) -> None:
        try:
            if self._handle is not None and not self._done:
                _lib.lib.px_request_cancel(self._handle)
            self._release()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

    def __await__(self):
        if self._done:
            return self._outcome_or_result()
        future = self._client._async_waiter().watch(self)
        yield from future.__await__()
        return self._outcome_or_result()


class AsyncWaiter:
    """Completes asyncio futures from the client's completion fd, on the loop's thread:
    no thread of its own, no polling."""

    def __init__(self, client: "Client", loop: asyncio.AbstractEventLoop):
        self._client = client
        self._loop = loop
        self._pending: dict = {}
        self._reading = False

    def watch(self, request: Request) -> "asyncio.Future":
        future = self._loop.create_future()
        self._pending[id(request)] = (request, future)
        if not self._reading:
            self._loop.add_reader(self._client.fileno(), self._on_readable)
            self._reading = True
        self._loop.call_soon(self._on_readable)  # it may have completed already
        return future

    def _on_readable(self) -> None:
        try:
            self._client.progress()
        except ParallaxError as e:
            for request, future in self._pending.values():
                if not future.done():
                    future.set_exception(e)
            self._pending.clear()
        for key, (request, future) in list(self._pending.items()):
            if future.done():
                del self._pending[key]
                continue
            try:
                if request.test():
                    future.set_result(None)
                    del self._pending[key]
            except ParallaxError as e:
                future.set_exception(e)
                del self._pending[key]
        if not self._pending and self._reading:
            self._loop.remove_reader(self._client.fileno())
            self._reading = False


def wait_all(requests: Iterable[Request], timeout: Optional[float] = None) -> list:
    """Waits for every request under one deadline; returns their results in order and
    raises the first failure (all are still waited for, so no buffer stays in use)."""
    requests = list(requests)
    deadline = None if timeout is None else time.monotonic() + timeout
    first: Optional[BaseException] = None
    results = []
    for r in requests:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            results.append(r.wait(left))
        except ParallaxError as e:
            first = first or e
            results.append(None)
    if first is not None:
        raise first
    return results
