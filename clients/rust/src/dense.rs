//! Dense variables: allreduce, broadcast, allgather(v).
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use crate::client::Client;
use crate::element::{DType, Element, OutBuffer};
use crate::request::{op_options, submit, Request};
use crate::{check, sys, Error, Result, VarStats};

/// (ABI 1.13) A dense variable's options (`px_dense_options`): the defaults, changed by the
/// builder methods. Every worker and node must register a variable with the same options.
#[derive(Clone, Copy, Debug)]
pub struct DenseOptions {
    pub(crate) raw: sys::px_dense_options,
}

impl Default for DenseOptions {
    fn default() -> Self {
        DenseOptions::new()
    }
}

impl DenseOptions {
    /// The defaults (`px_dense_options_init`).
    pub fn new() -> DenseOptions {
        let mut raw = sys::px_dense_options::default();
        // SAFETY: a whole struct to fill.
        unsafe { sys::px_dense_options_init(&mut raw) };
        DenseOptions { raw }
    }
    /// What an f32 variable's allreduce carries its sums in between nodes: `DType::F32`
    /// (the default) or, lossy, `DType::Bf16` / `DType::F16` (each partial sum rounded as it
    /// leaves a node; every worker gets the same result). The daemon refuses other dtypes.
    pub fn wire_dtype(mut self, dtype: DType) -> Self {
        self.raw.wire_dtype = dtype.raw();
        self
    }
}

/// A registered dense variable of `count` elements of `T` (`px_var`).
///
/// The n-th allreduce of a variable on every worker is step n (broadcast and allgather
/// steps are numbered apart); every worker must issue the same steps.
pub struct DenseVar<'c, T: Element> {
    client: &'c Client,
    raw: *mut sys::px_var,
    name: String,
    count: usize,
    _element: PhantomData<fn() -> T>,
}

// SAFETY: a px_var is an id in libparallax's locked handle table, usable from any thread.
unsafe impl<'c, T: Element> Send for DenseVar<'c, T> {}
unsafe impl<'c, T: Element> Sync for DenseVar<'c, T> {}

impl<'c, T: Element> DenseVar<'c, T> {
    pub(crate) fn new(client: &'c Client, raw: *mut sys::px_var, name: &str, count: usize) -> Self {
        DenseVar {
            client,
            raw,
            name: name.to_owned(),
            count,
            _element: PhantomData,
        }
    }

    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Elements per worker.
    pub fn count(&self) -> usize {
        self.count
    }
    /// The client it was registered on.
    pub fn client(&self) -> &'c Client {
        self.client
    }
    /// The raw handle, for calls this crate does not wrap.
    pub fn as_raw(&self) -> *mut sys::px_var {
        self.raw
    }

    /// The daemon's counters for this variable on this node (`px_var_stats_get`).
    pub fn stats(&self) -> Result<VarStats> {
        stats(self.raw)
    }

    fn expect_len(&self, what: &str, buffer: &str, len: usize, want: usize) -> Result<()> {
        if len == want {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{}('{}'): {} has {} elements, {} expected",
            what, self.name, buffer, len, want
        )))
    }

    /// Reduces `input` across every worker into `output` (`px_allreduce`); both hold
    /// `count` elements.
    pub fn allreduce<'a, O>(&'a self, input: &'a [T], output: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        self.expect_len("allreduce", "input", input.len(), self.count)?;
        self.expect_len("allreduce", "output", out.len, self.count)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: both buffers hold count elements and stay borrowed for 'a.
            sys::px_allreduce_ex(
                self.raw,
                input.as_ptr() as *const c_void,
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    /// Reduces `buffer` across every worker in place.
    pub fn allreduce_in_place<'a, O>(&'a self, buffer: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = buffer.out_parts()?;
        self.expect_len("allreduce", "buffer", out.len, self.count)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: in == out is allowed; count elements borrowed for 'a.
            sys::px_allreduce_ex(
                self.raw,
                out.ptr as *const c_void,
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    /// Copies the `root` worker's `input` (global rank) into every worker's `output`
    /// (`px_broadcast`). `input` is read on the root only, where it is required.
    pub fn broadcast<'a, O>(
        &'a self,
        root: usize,
        input: Option<&'a [T]>,
        output: &'a mut O,
    ) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        let root_i32 = self.check_root(root)?;
        let in_ptr = match input {
            Some(i) => {
                self.expect_len("broadcast", "input", i.len(), self.count)?;
                i.as_ptr() as *const c_void
            }
            None if self.client.world().rank == root => {
                return Err(Error::invalid(format!(
                    "broadcast('{}'): this worker is the root (rank {}) and gave no input",
                    self.name, root
                )))
            }
            None => ptr::null(),
        };
        self.expect_len("broadcast", "output", out.len, self.count)?;
        let o = op_options(root_i32);
        submit(out.busy, |r| unsafe {
            // SAFETY: input (root) and output hold count elements, borrowed for 'a.
            sys::px_broadcast_ex(self.raw, in_ptr, out.ptr as *mut c_void, &o, r)
        })
    }

    /// Broadcasts the root's `buffer` into every worker's `buffer`.
    pub fn broadcast_in_place<'a, O>(
        &'a self,
        root: usize,
        buffer: &'a mut O,
    ) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = buffer.out_parts()?;
        let root_i32 = self.check_root(root)?;
        self.expect_len("broadcast", "buffer", out.len, self.count)?;
        let o = op_options(root_i32);
        submit(out.busy, |r| unsafe {
            // SAFETY: in == out is allowed; count elements borrowed for 'a.
            sys::px_broadcast_ex(
                self.raw,
                out.ptr as *const c_void,
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    fn check_root(&self, root: usize) -> Result<i32> {
        let world = self.client.world().world_size;
        if root >= world {
            return Err(Error::invalid(format!(
                "broadcast('{}'): root {} is not a rank of the job (0..{})",
                self.name,
                root,
                world.saturating_sub(1)
            )));
        }
        Ok(root as i32)
    }

    /// Concatenates every worker's `input` (`count` elements) in rank order into `output`
    /// (`world_size * count` elements) (`px_allgather`).
    pub fn allgather<'a, O>(&'a self, input: &'a [T], output: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        let world = self.client.world().world_size;
        self.expect_len("allgather", "input", input.len(), self.count)?;
        self.expect_len("allgather", "output", out.len, self.count * world)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: sizes checked above; buffers borrowed for 'a.
            sys::px_allgather_ex(
                self.raw,
                input.as_ptr() as *const c_void,
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    /// Concatenates blocks of given sizes (`px_allgatherv`): `counts` has one entry per
    /// rank, the same on every worker, each at most `count`; `input` holds
    /// `counts[rank]` elements and `output` their sum.
    pub fn allgatherv<'a, O>(
        &'a self,
        input: &'a [T],
        counts: &[u64],
        output: &'a mut O,
    ) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        let w = self.client.world();
        if counts.len() != w.world_size {
            return Err(Error::invalid(format!(
                "allgatherv('{}'): counts has {} entries, the world has {} workers",
                self.name,
                counts.len(),
                w.world_size
            )));
        }
        let total = counts
            .iter()
            .try_fold(0usize, |sum, &c| sum.checked_add(c as usize));
        let total = total.ok_or_else(|| Error::invalid("allgatherv: counts overflow"))?;
        self.expect_len("allgatherv", "input", input.len(), counts[w.rank] as usize)?;
        self.expect_len("allgatherv", "output", out.len, total)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: sizes checked above; counts (world_size entries) and input are copied
            // at submission, output is borrowed for 'a.
            sys::px_allgatherv_ex(
                self.raw,
                input.as_ptr() as *const c_void,
                counts.as_ptr(),
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    /// Reduce-scatter (`px_reduce_scatter`, ABI 1.9): `input` holds a block of `count`
    /// elements per rank; each block is reduced across every worker with the variable's op
    /// and this rank's block lands in `output` (`count` elements).
    pub fn reduce_scatter<'a, O>(&'a self, input: &'a [T], output: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        let world = self.client.world().world_size;
        self.expect_len("reduce_scatter", "input", input.len(), self.count * world)?;
        self.expect_len("reduce_scatter", "output", out.len, self.count)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: sizes checked above; buffers borrowed for 'a.
            sys::px_reduce_scatter_ex(
                self.raw,
                input.as_ptr() as *const c_void,
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    /// Alltoall (`px_alltoall`, ABI 1.9): block `k` of `input` (`count` elements each, in
    /// rank order) goes to rank `k`; block `s` of `output` comes from rank `s`.
    pub fn alltoall<'a, O>(&'a self, input: &'a [T], output: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        let world = self.client.world().world_size;
        self.expect_len("alltoall", "input", input.len(), self.count * world)?;
        self.expect_len("alltoall", "output", out.len, self.count * world)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: sizes checked above; buffers borrowed for 'a.
            sys::px_alltoall_ex(
                self.raw,
                input.as_ptr() as *const c_void,
                out.ptr as *mut c_void,
                &o,
                r,
            )
        })
    }

    /// Alltoall of blocks of given sizes (`px_alltoallv`, ABI 1.9): `send_counts[k]`
    /// elements of `input` go to rank `k`, `recv_counts[s]` elements of `output` come from
    /// rank `s` (each at most `count`; rank `s`'s send count for this rank must be
    /// `recv_counts[s]`).
    pub fn alltoallv<'a, O>(
        &'a self,
        input: &'a [T],
        send_counts: &[u64],
        output: &'a mut O,
        recv_counts: &[u64],
    ) -> Result<Request<'a>>
    where
        O: OutBuffer<T> + ?Sized,
    {
        let out = output.out_parts()?;
        let world = self.client.world().world_size;
        if send_counts.len() != world || recv_counts.len() != world {
            return Err(Error::invalid(format!(
                "alltoallv('{}'): {} send and {} receive counts, the world has {} workers",
                self.name,
                send_counts.len(),
                recv_counts.len(),
                world
            )));
        }
        let sum = |counts: &[u64]| {
            counts
                .iter()
                .try_fold(0usize, |s, &c| s.checked_add(c as usize))
        };
        let sent = sum(send_counts).ok_or_else(|| Error::invalid("alltoallv: counts overflow"))?;
        let received =
            sum(recv_counts).ok_or_else(|| Error::invalid("alltoallv: counts overflow"))?;
        self.expect_len("alltoallv", "input", input.len(), sent)?;
        self.expect_len("alltoallv", "output", out.len, received)?;
        let o = op_options(0);
        submit(out.busy, |r| unsafe {
            // SAFETY: sizes checked above; the counts (world_size entries each) and input are
            // copied at submission, output is borrowed for 'a.
            sys::px_alltoallv_ex(
                self.raw,
                input.as_ptr() as *const c_void,
                send_counts.as_ptr(),
                out.ptr as *mut c_void,
                recv_counts.as_ptr(),
                &o,
                r,
            )
        })
    }
}

pub(crate) fn stats(raw: *mut sys::px_var) -> Result<VarStats> {
    let mut s = VarStats {
        struct_size: std::mem::size_of::<VarStats>() as u32,
        ..Default::default()
    };
    // SAFETY: a live variable; s is a whole px_var_stats.
    check(unsafe { sys::px_var_stats_get(raw, &mut s) })?;
    Ok(s)
}

impl<'c, T: Element> std::fmt::Debug for DenseVar<'c, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseVar")
            .field("name", &self.name)
            .field("dtype", &T::DTYPE)
            .field("count", &self.count)
            .finish()
    }
}
