//! The connection to the node's daemon, and memory in its shared arena.
use std::ffi::CString;
use std::ops::{Deref, DerefMut};
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::dense::{DenseOptions, DenseVar};
use crate::element::{Element, ReduceOp};
use crate::sparse::{SparseGroup, SparseOptions, SparseVar};
use crate::{c_arg, check, sys, Error, Result};

/// Where this worker sits in the job (`px_world_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorldInfo {
    /// This node's index in the cluster.
    pub node_index: usize,
    /// Nodes in the cluster.
    pub node_count: usize,
    /// Global rank, node-major.
    pub rank: usize,
    /// Workers of the job across all nodes.
    pub world_size: usize,
    /// Rank among this node's workers of the job.
    pub local_rank: usize,
    /// Workers of the job on this node.
    pub local_size: usize,
}

/// `px_connect_options` as a builder. Unset fields take libparallax's defaults, which read
/// `PARALLAX_SOCKET`, `PARALLAX_JOB`, `PARALLAX_LOCAL_RANK`, `PARALLAX_LOCAL_SIZE`,
/// `PARALLAX_ARENA_BYTES` and `PARALLAX_WAIT_FOR_DAEMON`.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    socket: Option<PathBuf>,
    job: Option<String>,
    local_rank: Option<u32>,
    local_size: Option<u32>,
    timeout: Option<Duration>,
    arena_bytes: Option<u64>,
    wait_for_daemon: Option<bool>,
}

impl ConnectOptions {
    /// All defaults.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }
    /// The daemon's socket.
    pub fn socket(mut self, path: impl AsRef<Path>) -> Self {
        self.socket = Some(path.as_ref().to_path_buf());
        self
    }
    /// The job's name; every worker of a job names the same.
    pub fn job(mut self, name: impl Into<String>) -> Self {
        self.job = Some(name.into());
        self
    }
    /// This worker's local rank (default: the first free one).
    pub fn local_rank(mut self, rank: u32) -> Self {
        self.local_rank = Some(rank);
        self
    }
    /// How many workers of the job run on this node; connecting waits for all of them.
    pub fn local_size(mut self, size: u32) -> Self {
        self.local_size = Some(size);
        self
    }
    /// The deadline for connecting (all local workers) and for control calls (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// The shared arena's size, in [1 MiB, 16 GiB] (default 256 MiB).
    pub fn arena_bytes(mut self, bytes: u64) -> Self {
        self.arena_bytes = Some(bytes);
        self
    }
    /// Wait up to the timeout for a daemon whose socket does not exist yet.
    pub fn wait_for_daemon(mut self, wait: bool) -> Self {
        self.wait_for_daemon = Some(wait);
        self
    }

    /// Connects (`px_connect`), waiting until every local worker of the job has.
    pub fn connect(&self) -> Result<Client> {
        let socket =
            match &self.socket {
                Some(p) => Some(CString::new(p.as_os_str().as_bytes()).map_err(|_| {
                    Error::invalid(format!("socket path {:?} contains a NUL byte", p))
                })?),
                None => None,
            };
        let job = match &self.job {
            Some(j) => Some(c_arg("job name", j)?),
            None => None,
        };
        let mut o = unsafe {
            let mut o = std::mem::MaybeUninit::<sys::px_connect_options>::uninit();
            // SAFETY: px_connect_options_init_abi writes every field. As this crate's ABI
            // version: the daemon tells it the statuses it knows.
            sys::px_connect_options_init_abi(o.as_mut_ptr(), sys::PX_ABI_VERSION);
            o.assume_init()
        };
        o.socket_path = socket.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        o.job_name = job.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        if let Some(r) = self.local_rank {
            o.local_rank = i32::try_from(r).map_err(|_| Error::invalid("local_rank too large"))?;
        }
        if let Some(n) = self.local_size {
            o.local_size = i32::try_from(n).map_err(|_| Error::invalid("local_size too large"))?;
        }
        if let Some(t) = self.timeout {
            o.timeout_ms = duration_ms(t);
        }
        if let Some(b) = self.arena_bytes {
            o.arena_bytes = b;
        }
        if let Some(w) = self.wait_for_daemon {
            o.wait_for_daemon = w as i32;
        }
        let mut raw = ptr::null_mut();
        // SAFETY: o and the strings it points to live across the call; raw is written.
        check(unsafe { sys::px_connect(&o, &mut raw) })?;
        let mut info = sys::px_world_info {
            struct_size: std::mem::size_of::<sys::px_world_info>() as u32,
            ..Default::default()
        };
        // SAFETY: raw is a live client; info is a whole px_world_info.
        if let Err(e) = check(unsafe { sys::px_world(raw, &mut info) }) {
            unsafe { sys::px_disconnect(raw) };
            return Err(e);
        }
        let world = WorldInfo {
            node_index: info.node_index as usize,
            node_count: info.node_count as usize,
            rank: info.rank as usize,
            world_size: info.world_size as usize,
            local_rank: info.local_rank as usize,
            local_size: info.local_size as usize,
        };
        Ok(Client { raw, world })
    }
}

/// Milliseconds for the C API, rounded up so a short wait is not a poll; saturating.
pub(crate) fn duration_ms(d: Duration) -> i64 {
    let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// A connection to the node's parallaxd (`px_client`); disconnects when dropped.
pub struct Client {
    raw: *mut sys::px_client,
    world: WorldInfo,
}

// SAFETY: a px_client is an id into libparallax's locked handle table, and every function
// taking one may be called from any thread (parallax_c.h, "Thread safety"); the world info
// is plain data.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl Client {
    /// A builder of connect options.
    pub fn builder() -> ConnectOptions {
        ConnectOptions::new()
    }

    /// Connects with every option from the environment (`PARALLAX_*`) or its default.
    pub fn connect_default() -> Result<Client> {
        ConnectOptions::new().connect()
    }

    /// The raw handle, for calls this crate does not wrap. Do not disconnect it.
    pub fn as_raw(&self) -> *mut sys::px_client {
        self.raw
    }

    /// Node, rank and sizes of this worker.
    pub fn world(&self) -> WorldInfo {
        self.world
    }

    /// Registers a dense variable of `count` elements of `T` (`px_register_dense`).
    pub fn register_dense<T: Element>(
        &self,
        name: &str,
        count: usize,
        op: ReduceOp,
    ) -> Result<DenseVar<'_, T>> {
        self.register_dense_with(name, count, op, &DenseOptions::new())
    }

    /// (ABI 1.13) Registers a dense variable with options (`px_register_dense_ex`), e.g. a
    /// 16-bit wire between nodes.
    pub fn register_dense_with<T: Element>(
        &self,
        name: &str,
        count: usize,
        op: ReduceOp,
        options: &DenseOptions,
    ) -> Result<DenseVar<'_, T>> {
        let cname = c_arg("variable name", name)?;
        let mut var = ptr::null_mut();
        // SAFETY: live client, NUL-terminated name, a whole options struct, var is written.
        check(unsafe {
            sys::px_register_dense_ex(
                self.raw,
                cname.as_ptr(),
                T::DTYPE.raw(),
                count as u64,
                op.raw(),
                &options.raw,
                &mut var,
            )
        })?;
        Ok(DenseVar::new(self, var, name, count))
    }

    /// Registers a sparse `rows` x `dim` f32 table (`px_register_sparse`).
    pub fn register_sparse(
        &self,
        name: &str,
        rows: u64,
        dim: usize,
        options: &SparseOptions,
    ) -> Result<SparseVar<'_>> {
        let cname = c_arg("variable name", name)?;
        let o = options.to_raw();
        let mut var = ptr::null_mut();
        // SAFETY: live client, NUL-terminated name, a whole options struct; var is written.
        check(unsafe {
            sys::px_register_sparse(
                self.raw,
                cname.as_ptr(),
                sys::PX_F32,
                rows,
                dim as u64,
                &o,
                &mut var,
            )
        })?;
        Ok(SparseVar::new(self, var, name, rows, dim))
    }

    /// (ABI 1.12) Registers tables that take their steps together, held by the daemons as
    /// one sparse variable, their rows one after another (`px_register_sparse_group`):
    /// `tables` are (name, rows) pairs, every table `dim` wide with `options`.
    pub fn register_sparse_group(
        &self,
        name: &str,
        tables: &[(&str, u64)],
        dim: usize,
        options: &SparseOptions,
    ) -> Result<SparseGroup<'_>> {
        let cname = c_arg("group name", name)?;
        let names = tables
            .iter()
            .map(|(t, _)| c_arg("table name", t))
            .collect::<Result<Vec<_>>>()?;
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let rows: Vec<u64> = tables.iter().map(|(_, r)| *r).collect();
        let o = options.to_raw();
        let mut group = ptr::null_mut();
        let mut handles = vec![ptr::null_mut(); tables.len()];
        // SAFETY: live client, NUL-terminated names, n names and rows, a whole options
        // struct; group and n handles are written.
        check(unsafe {
            sys::px_register_sparse_group(
                self.raw,
                cname.as_ptr(),
                sys::PX_F32,
                tables.len() as u64,
                name_ptrs.as_ptr(),
                rows.as_ptr(),
                dim as u64,
                &o,
                &mut group,
                handles.as_mut_ptr(),
            )
        })?;
        let total = rows.iter().sum();
        let tables = tables
            .iter()
            .zip(handles)
            .map(|((t, r), h)| SparseVar::new(self, h, t, *r, dim))
            .collect();
        Ok(SparseGroup::new(
            SparseVar::new(self, group, name, total, dim),
            tables,
        ))
    }

    /// Returns once every worker of the job, on every node, has entered (`px_barrier`).
    /// One that times out is withdrawn, so it never releases the others.
    pub fn barrier(&self, timeout: Duration) -> Result<()> {
        // SAFETY: live client.
        check(unsafe { sys::px_barrier(self.raw, duration_ms(timeout)) })
    }

    /// Writes every sparse variable of the job to `dir` (`px_checkpoint`).
    pub fn checkpoint(&self, dir: impl AsRef<Path>, timeout: Duration) -> Result<()> {
        let dir = dir.as_ref();
        let path = CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
            Error::invalid(format!("checkpoint path {:?} contains a NUL byte", dir))
        })?;
        // SAFETY: live client, NUL-terminated path.
        check(unsafe { sys::px_checkpoint(self.raw, path.as_ptr(), duration_ms(timeout).max(1)) })
    }

    /// Fails the job on every node at once with `reason` (`px_abort`). The client stays
    /// valid for freeing requests and disconnecting.
    pub fn abort(&self, reason: &str) -> Result<()> {
        let reason = c_arg("abort reason", reason)?;
        // SAFETY: live client, NUL-terminated reason.
        check(unsafe { sys::px_abort(self.raw, reason.as_ptr()) })
    }

    /// `len` zeroed elements in the arena shared with the daemon (`px_alloc`): operations
    /// on it need no staging copy. Freed when dropped.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<ArenaBuffer<'_, T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid(format!("alloc of {} elements overflows", len)))?;
        if bytes == 0 {
            return Ok(ArenaBuffer::new(self, NonNull::dangling(), 0));
        }
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: live client; p is written.
        check(unsafe { sys::px_alloc(self.raw, bytes as u64, &mut p) })?;
        let p = p as *mut T;
        // Zeroed so the slice holds defined values: a reused block keeps old bytes.
        // SAFETY: px_alloc returned `bytes` bytes, 64-byte aligned, owned by us.
        unsafe { ptr::write_bytes(p as *mut u8, 0, bytes) };
        lock_blocks().push((p as usize, bytes));
        Ok(ArenaBuffer::new(
            self,
            NonNull::new(p).expect("px_alloc returned NULL"),
            len,
        ))
    }

    /// The message of the last failed call made with this client, on any thread
    /// (`px_client_last_error`).
    pub fn last_error(&self) -> String {
        let mut len: u64 = 0;
        // SAFETY: size 0 with a NULL buffer only reports the length.
        if unsafe { sys::px_client_last_error(self.raw, ptr::null_mut(), 0, &mut len) }
            != sys::PX_OK
        {
            return String::new();
        }
        let mut buf = vec![0u8; len as usize + 1];
        // SAFETY: buf holds len + 1 bytes.
        let s = unsafe {
            sys::px_client_last_error(
                self.raw,
                buf.as_mut_ptr() as *mut c_char,
                buf.len() as u64,
                &mut len,
            )
        };
        if s != sys::PX_OK {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// A level-triggered fd, readable when a request may have completed (`px_client_fd`);
    /// then call [`progress`](Client::progress) and `test` the requests. Owned by the client.
    pub fn completion_fd(&self) -> Result<RawFd> {
        let mut fd: c_int = -1;
        // SAFETY: live client; fd is written.
        check(unsafe { sys::px_client_fd(self.raw, &mut fd) })?;
        Ok(fd)
    }

    /// Takes posted completions without blocking (`px_progress`).
    pub fn progress(&self) -> Result<()> {
        // SAFETY: live client.
        check(unsafe { sys::px_progress(self.raw) })
    }

    /// Disconnects now (`px_disconnect`), reporting a failure that dropping would ignore.
    pub fn disconnect(self) -> Result<()> {
        let raw = self.raw;
        std::mem::forget(self);
        // SAFETY: raw is live and, self being forgotten, disconnected once.
        check(unsafe { sys::px_disconnect(raw) })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: nothing borrows the client any more (variables, buffers and requests
        // hold &Client), so its arena may go.
        unsafe { sys::px_disconnect(self.raw) };
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("world", &self.world)
            .finish()
    }
}

// Live arena blocks of every client of the process, (address, bytes): a plain slice that
// points into one is refused as an output (element.rs), since only an ArenaBuffer passed
// whole can be locked against a leaked request.
static ARENA_BLOCKS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn lock_blocks() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    // A panic while holding it cannot leave the list inconsistent (single push/remove).
    ARENA_BLOCKS.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn overlaps_arena_block(addr: usize, bytes: usize) -> bool {
    bytes > 0
        && lock_blocks()
            .iter()
            .any(|&(a, n)| addr < a + n && a < addr + bytes)
}

/// Elements in the shared arena (`px_alloc`), dereferencing to a slice; freed on drop.
///
/// Pass it whole (`&mut buf`) as an operation's output: it then counts the operation as
/// in flight until its [`Request`](crate::Request) completes or is dropped. If a request
/// is leaked (`mem::forget`) the daemon may still write here, so the buffer then panics
/// on access and is never freed.
pub struct ArenaBuffer<'c, T: Element> {
    ptr: NonNull<T>,
    len: usize,
    client: &'c Client,
    busy: AtomicUsize,
}

// SAFETY: like a Box<[T]> (T: Send + Sync), freed through a thread-safe client.
unsafe impl<'c, T: Element> Send for ArenaBuffer<'c, T> {}
unsafe impl<'c, T: Element> Sync for ArenaBuffer<'c, T> {}

impl<'c, T: Element> ArenaBuffer<'c, T> {
    fn new(client: &'c Client, ptr: NonNull<T>, len: usize) -> Self {
        ArenaBuffer {
            ptr,
            len,
            client,
            busy: AtomicUsize::new(0),
        }
    }

    /// The client whose arena holds it.
    pub fn client(&self) -> &'c Client {
        self.client
    }

    fn check_idle(&self) {
        if self.busy.load(Ordering::Acquire) != 0 {
            panic!(
                "ArenaBuffer used while an operation on it may still be running: its Request \
                 was leaked (mem::forget) or could not be cancelled, so parallaxd may write it"
            );
        }
    }

    pub(crate) fn parts_for_operation(&mut self) -> Result<(*mut T, usize, &AtomicUsize)> {
        if self.busy.load(Ordering::Acquire) != 0 {
            return Err(Error::invalid(
                "this ArenaBuffer has an operation that was leaked (mem::forget of its Request)",
            ));
        }
        Ok((self.ptr.as_ptr(), self.len, &self.busy))
    }
}

impl<'c, T: Element> Deref for ArenaBuffer<'c, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.check_idle();
        // SAFETY: len initialised elements (zeroed at alloc), not written by the daemon
        // while busy is 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<'c, T: Element> DerefMut for ArenaBuffer<'c, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.check_idle();
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<'c, T: Element> Drop for ArenaBuffer<'c, T> {
    fn drop(&mut self) {
        if self.len == 0 || self.busy.load(Ordering::Acquire) != 0 {
            return; // nothing allocated, or leaked on purpose: the daemon may write it
        }
        let addr = self.ptr.as_ptr() as usize;
        {
            let mut blocks = lock_blocks();
            if let Some(i) = blocks.iter().position(|&(a, _)| a == addr) {
                blocks.swap_remove(i);
            }
        }
        // SAFETY: allocated by px_alloc on this client, which the borrow keeps connected.
        unsafe { sys::px_free(self.client.raw, self.ptr.as_ptr() as *mut c_void) };
    }
}

impl<'c, T: Element + std::fmt::Debug> std::fmt::Debug for ArenaBuffer<'c, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
