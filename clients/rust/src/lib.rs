//! Safe Rust bindings to libparallax, the C ABI (1.15) of `parallaxd`.
//!
//! ```no_run
//! use parallax::{Client, ReduceOp};
//! use std::time::Duration;
//!
//! let client = Client::builder().job("train").local_size(2).connect()?;
//! let grad = client.register_dense::<f32>("grad", 4, ReduceOp::Mean)?;
//! let mut g = vec![1.0f32; 4];
//! grad.allreduce_in_place(&mut g)?.wait(Duration::from_secs(30))?;
//! # Ok::<(), parallax::Error>(())
//! ```
//!
//! # Lifetimes
//! [`DenseVar`], [`SparseVar`] and [`ArenaBuffer`] borrow their [`Client`], so it cannot
//! be disconnected (which unmaps the arena) while they live. A [`Request<'a>`](Request)
//! borrows the variable and every buffer of its operation for `'a`: safe code cannot read,
//! write or free them until the request is dropped, and dropping an incomplete request
//! cancels it (`px_request_cancel`: a step other local workers still wait for fails for
//! them with `Status::Cancelled`, as dropping a future withdraws it) before freeing it.
//!
//! `std::mem::forget` of a request must not leave memory the daemon writes in reach of
//! safe code. Ordinary memory is safe: libparallax stages it and copies a result out only
//! inside `px_wait`/`px_test` of that request, so a forgotten request never writes it.
//! Arena memory is written by the daemon directly, so an operation may write arena memory
//! only through an [`ArenaBuffer`] passed whole (`&mut ArenaBuffer`), which counts its
//! operations in flight; a forgotten one leaves that count up, after which the buffer
//! panics on access and leaks instead of freeing (the same "leak amplification" as
//! `Vec::drain`). A plain slice pointing into an arena is refused as an output.
//!
//! # Threads
//! libparallax's handles are ids looked up in a locked table (clients/c/handles.cc), not
//! pointers, and every function may be called from any thread (parallax_c.h). So
//! [`Client`], the variables, [`ArenaBuffer`] and [`Request`] are `Send` and `Sync`; a
//! request's waits take `&mut self`, so one request is waited on by one thread at a time.
//! Steps are numbered in submission order per variable and worker: submitting to one
//! variable from several threads makes that order (and the pairing of steps across
//! workers) racy, though never unsafe.
#![warn(missing_docs)]

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

pub mod sys;

mod client;
mod dense;
mod element;
mod request;
mod sparse;

pub use client::{ArenaBuffer, Client, ConnectOptions, WorldInfo};
pub use dense::{DenseOptions, DenseVar};
pub use element::{Bf16, DType, Element, OutBuffer, ReduceOp, F16};
pub use request::Request;
pub use sparse::{
    Consistency, Initializer, NonFinite, Optimizer, Route, SparseGroup, SparseOptions, SparseVar,
    Split,
};

/// Statistics the daemon keeps for a variable on this node (`px_var_stats`).
pub type VarStats = sys::px_var_stats;

/// A `px_status`. `Ok` is listed for completeness; an [`Error`] never carries it. Later ABI
/// versions add statuses (1.15: `Membership`), so a `match` needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// `PX_OK`
    Ok,
    /// `PX_ERR_INVALID`: a bad argument.
    Invalid,
    /// `PX_ERR_VERSION`: client and daemon ABI versions are incompatible.
    Version,
    /// `PX_ERR_CONNECT`: the daemon could not be reached or refused the connection.
    Connect,
    /// `PX_ERR_TIMEOUT`: a deadline passed; a request stays valid.
    Timeout,
    /// `PX_ERR_PEER_LOST`: another worker or node of the job died, or the daemon did.
    PeerLost,
    /// `PX_ERR_MISMATCH`: a variable registered with another shape, type, op or options.
    Mismatch,
    /// `PX_ERR_NOT_FOUND`: unknown variable or handle.
    NotFound,
    /// `PX_ERR_NO_MEMORY`: the shared-memory arena (or the daemon) is out of memory.
    NoMemory,
    /// `PX_ERR_BUSY`: too many requests outstanding on this client.
    Busy,
    /// `PX_ERR_PROTOCOL`: a malformed message between client and daemon.
    Protocol,
    /// `PX_ERR_INDEX`: a row index out of range.
    Index,
    /// `PX_ERR_NOT_IMPLEMENTED`: see the README's limits.
    NotImplemented,
    /// `PX_ERR_INTERNAL`: a bug in libparallax or parallaxd.
    Internal,
    /// `PX_ERR_PERMISSION`: the daemon refused this process's credentials.
    Permission,
    /// `PX_ERR_CANCELLED`: cancelled, or withdrawn by another worker.
    Cancelled,
    /// `PX_ERR_MEMBERSHIP`: nodes joined the cluster, so this run of the job ended; connect
    /// again and re-read the world (membership on etcd).
    Membership,
    /// A value this crate does not know (a newer library).
    Unknown(i32),
}

impl Status {
    /// The status of a raw `px_status` value.
    pub fn from_raw(raw: sys::px_status) -> Status {
        match raw {
            sys::PX_OK => Status::Ok,
            sys::PX_ERR_INVALID => Status::Invalid,
            sys::PX_ERR_VERSION => Status::Version,
            sys::PX_ERR_CONNECT => Status::Connect,
            sys::PX_ERR_TIMEOUT => Status::Timeout,
            sys::PX_ERR_PEER_LOST => Status::PeerLost,
            sys::PX_ERR_MISMATCH => Status::Mismatch,
            sys::PX_ERR_NOT_FOUND => Status::NotFound,
            sys::PX_ERR_NO_MEMORY => Status::NoMemory,
            sys::PX_ERR_BUSY => Status::Busy,
            sys::PX_ERR_PROTOCOL => Status::Protocol,
            sys::PX_ERR_INDEX => Status::Index,
            sys::PX_ERR_NOT_IMPLEMENTED => Status::NotImplemented,
            sys::PX_ERR_INTERNAL => Status::Internal,
            sys::PX_ERR_PERMISSION => Status::Permission,
            sys::PX_ERR_CANCELLED => Status::Cancelled,
            sys::PX_ERR_MEMBERSHIP => Status::Membership,
            other => Status::Unknown(other),
        }
    }

    /// The raw `px_status` value.
    pub fn raw(self) -> sys::px_status {
        match self {
            Status::Ok => sys::PX_OK,
            Status::Invalid => sys::PX_ERR_INVALID,
            Status::Version => sys::PX_ERR_VERSION,
            Status::Connect => sys::PX_ERR_CONNECT,
            Status::Timeout => sys::PX_ERR_TIMEOUT,
            Status::PeerLost => sys::PX_ERR_PEER_LOST,
            Status::Mismatch => sys::PX_ERR_MISMATCH,
            Status::NotFound => sys::PX_ERR_NOT_FOUND,
            Status::NoMemory => sys::PX_ERR_NO_MEMORY,
            Status::Busy => sys::PX_ERR_BUSY,
            Status::Protocol => sys::PX_ERR_PROTOCOL,
            Status::Index => sys::PX_ERR_INDEX,
            Status::NotImplemented => sys::PX_ERR_NOT_IMPLEMENTED,
            Status::Internal => sys::PX_ERR_INTERNAL,
            Status::Permission => sys::PX_ERR_PERMISSION,
            Status::Cancelled => sys::PX_ERR_CANCELLED,
            Status::Membership => sys::PX_ERR_MEMBERSHIP,
            Status::Unknown(raw) => raw,
        }
    }

    /// The enum's C name, `"PX_ERR_TIMEOUT"` (`px_status_name`).
    pub fn name(self) -> String {
        // SAFETY: px_status_name returns a static string for every value, never NULL.
        unsafe { c_string(sys::px_status_name(self.raw())) }
    }

    /// A phrase for the status, `"deadline exceeded"` (`px_strerror`).
    pub fn describe(self) -> String {
        // SAFETY: as above.
        unsafe { c_string(sys::px_strerror(self.raw())) }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A failed call or operation: its status and the library's or daemon's message (for an
/// operation, `px_request_error`: node, worker, variable and step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with this status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::Invalid, message)
    }

    /// The status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The message, whole.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}: {}", self.status, self.status.describe())
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `Result<T, Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// libparallax's ABI version, `(major, minor)` (`px_abi_version`).
pub fn abi_version() -> (u16, u16) {
    // SAFETY: no arguments, no state.
    let v = unsafe { sys::px_abi_version() };
    ((v >> 16) as u16, (v & 0xffff) as u16)
}

/// Copies a C string the library owns; NULL gives "".
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_string_lossy().into_owned()
}

/// The result of a call that returned `status`: the thread's `px_last_error` is exactly
/// that call's message (a client's last error could be another thread's).
pub(crate) fn check(status: sys::px_status) -> Result<()> {
    if status == sys::PX_OK {
        return Ok(());
    }
    // SAFETY: px_last_error returns the calling thread's message, never NULL.
    let message = unsafe { c_string(sys::px_last_error()) };
    Err(Error::new(Status::from_raw(status), message))
}

/// A C string argument; interior NULs are an error rather than a silent cut.
pub(crate) fn c_arg(what: &str, s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s)
        .map_err(|_| Error::invalid(format!("{} {:?} contains a NUL byte", what, s)))
}
