//! One submitted operation (`px_request`).
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::client::duration_ms;
use crate::{c_string, sys, Error, Result, Status};

/// A submitted operation. It borrows the variable and every buffer of the operation for
/// `'a`, so they stay untouched until it is dropped. Dropping it before it completed
/// cancels it (`px_request_cancel`), then frees it (`px_request_free`).
#[must_use = "dropping a Request at once cancels its operation; wait() for it"]
pub struct Request<'a> {
    raw: *mut sys::px_request,
    // The daemon can no longer write the operation's buffers: it completed, failed, or
    // was cancelled.
    settled: bool,
    // The arena buffer the operation writes, counted in flight until settled.
    busy: Option<&'a AtomicUsize>,
    // The operation's buffers (read and written) and variable, borrowed for 'a.
    _borrows: PhantomData<&'a mut [u8]>,
}

// SAFETY: a px_request is an id in libparallax's locked handle table; it may be waited on,
// tested, cancelled and freed from any thread (parallax_c.h). The borrowed buffers are of
// Element types (Send + Sync). Every method that acts on it takes &mut self.
unsafe impl<'a> Send for Request<'a> {}
unsafe impl<'a> Sync for Request<'a> {}

impl<'a> Request<'a> {
    /// Wraps a request libparallax just returned; `busy` has been counted up.
    pub(crate) fn new(raw: *mut sys::px_request, busy: Option<&'a AtomicUsize>) -> Request<'a> {
        Request {
            raw,
            settled: false,
            busy,
            _borrows: PhantomData,
        }
    }

    /// The raw handle, for calls this crate does not wrap. Do not free it.
    pub fn as_raw(&self) -> *mut sys::px_request {
        self.raw
    }

    fn settle(&mut self) {
        if !self.settled {
            self.settled = true;
            if let Some(busy) = self.busy {
                busy.fetch_sub(1, Ordering::Release);
            }
        }
    }

    // The operation's error: its own message (px_request_error, kept by the request,
    // whichever thread waited), else the failed call's (px_last_error, e.g. a cancel's).
    fn error(&self, status: sys::px_status) -> Error {
        // SAFETY: px_last_error is this thread's message of the call that just failed; read
        // it before any other px_ call resets it.
        let call_message = unsafe { c_string(sys::px_last_error()) };
        // SAFETY: a live request; the message lives until px_request_free.
        let message = unsafe { c_string(sys::px_request_error(self.raw)) };
        Error::new(
            Status::from_raw(status),
            if message.is_empty() {
                call_message
            } else {
                message
            },
        )
    }

    /// Waits up to `timeout` for the operation. `Err` with [`Status::Timeout`] leaves it
    /// pending (wait again, or drop it to cancel); any other outcome is final and repeats.
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        // SAFETY: a live request (freed only in drop).
        let mut status = unsafe { sys::px_wait(self.raw, duration_ms(timeout)) };
        if status == sys::PX_ERR_TIMEOUT && !self.settled {
            // SAFETY: this thread's message of the px_wait that just timed out.
            let message = unsafe { c_string(sys::px_last_error()) };
            // Either still pending, or completed since (its result is px_test's), or
            // failed by the daemon's stall deadline (step_stall_ms), also a TIMEOUT.
            let mut done = 0;
            // SAFETY: live request; done is written.
            let tested = unsafe { sys::px_test(self.raw, &mut done) };
            if done == 0 {
                return Err(Error::new(Status::Timeout, message));
            }
            status = tested;
        }
        self.settle();
        if status == sys::PX_OK {
            Ok(())
        } else {
            Err(self.error(status))
        }
    }

    /// Whether the operation completed, without blocking: `Ok(true)` when it succeeded,
    /// `Err` when it failed, `Ok(false)` while it runs.
    pub fn test(&mut self) -> Result<bool> {
        let mut done = 0;
        // SAFETY: live request; done is written.
        let status = unsafe { sys::px_test(self.raw, &mut done) };
        if done == 0 && status == sys::PX_OK {
            return Ok(false);
        }
        if done != 0 {
            self.settle();
        }
        if status == sys::PX_OK {
            Ok(true)
        } else {
            Err(self.error(status))
        }
    }

    /// Cancels the operation (`px_request_cancel`): once this returns `Ok`, nothing writes
    /// its output any more and `wait` reports [`Status::Cancelled`] (unless it already
    /// reported the result). A step other local workers wait for fails for them.
    pub fn cancel(&mut self) -> Result<()> {
        // SAFETY: live request.
        let status = unsafe { sys::px_request_cancel(self.raw) };
        if status == sys::PX_OK {
            self.settle();
        }
        crate::check(status)
    }

    /// Waits for every request, sharing one deadline; the first failure, if any, after
    /// waiting for all (`px_wait_all`'s rule, kept per request here).
    pub fn wait_all(requests: &mut [Request<'a>], timeout: Duration) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        let mut first: Option<Error> = None;
        for r in requests.iter_mut() {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => timeout,
            };
            if let Err(e) = r.wait(left) {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<'a> Drop for Request<'a> {
    fn drop(&mut self) {
        if !self.settled {
            // Required before the borrows end: an arena output is the daemon's to write
            // until the operation completes or is cancelled. A cancel that fails (the
            // operation runs past the connection's timeout) leaves `busy` counted, so that
            // buffer stays locked and leaks rather than being reused under the daemon.
            // SAFETY: live request.
            if unsafe { sys::px_request_cancel(self.raw) } == sys::PX_OK {
                self.settle();
            }
        }
        // Ordinary memory is never written after this (the library copies results out
        // only inside px_wait/px_test).
        // SAFETY: live request, freed once.
        unsafe { sys::px_request_free(self.raw) };
    }
}

impl<'a> std::fmt::Debug for Request<'a> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("raw", &self.raw)
            .field("settled", &self.settled)
            .finish()
    }
}

/// Submits an operation through `call` (which gets the out_request pointer) and wraps the
/// request, counting `busy` (its arena output) in flight once it was accepted.
pub(crate) fn submit<'a, F>(busy: Option<&'a AtomicUsize>, call: F) -> Result<Request<'a>>
where
    F: FnOnce(*mut *mut sys::px_request) -> sys::px_status,
{
    let mut raw = std::ptr::null_mut();
    crate::check(call(&mut raw))?;
    if let Some(b) = busy {
        b.fetch_add(1, Ordering::AcqRel);
    }
    Ok(Request::new(raw, busy))
}

/// Default per-operation options (`px_op_options_init`) with a broadcast root.
pub(crate) fn op_options(root: i32) -> sys::px_op_options {
    let mut o = std::mem::MaybeUninit::<sys::px_op_options>::uninit();
    // SAFETY: px_op_options_init writes every field.
    let mut o = unsafe {
        sys::px_op_options_init(o.as_mut_ptr());
        o.assume_init()
    };
    o.root = root;
    o
}
