//! Sparse variables: tables held by the daemons, pulled and pushed by rows.
use std::os::raw::c_void;

use crate::client::Client;
use crate::dense::stats;
use crate::element::{DType, OutBuffer, ReduceOp};
use crate::request::{op_options, submit, Request};
use crate::{sys, Error, Result, VarStats};

/// `px_optimizer`: how a shard applies pushed gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// `w -= lr * g`
    Sgd,
    /// `a += g*g; w -= lr * g / (sqrt(a) + epsilon)`, `a` from `initial_accumulator`.
    Adagrad,
    /// Lazy Adam (moments of touched rows only), as TF's LazyAdam.
    Adam,
}

/// `px_initializer`: a table's initial values, a function of (seed, row, column) only.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Initializer {
    /// Zeros (the default).
    Zeros,
    /// Uniform in `[low, high)`.
    Uniform {
        /// Inclusive lower bound.
        low: f64,
        /// Exclusive upper bound.
        high: f64,
    },
    /// Normal(0, std).
    Normal {
        /// Standard deviation.
        std: f64,
    },
}

/// `px_consistency`: what pull step n sees of earlier pushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Every update of push steps 0..n-1 of every worker (the default).
    Sync,
    /// At least push steps 0..n-1-staleness.
    Bounded(u32),
    /// Whatever has been applied when the request reaches each shard.
    Async,
}

/// `px_route`: how the table is kept and updated across nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Sharded parameter server for the sparse part (the default).
    Hybrid,
    /// Sharded parameter server.
    Ps,
    /// A replica per node, coalesced gradients all-gathered.
    Allgatherv,
    /// Densified gradients allreduced (the sparse_as_dense baseline).
    Allreduce,
    /// A per-step exchange with every node, each holding a slice of the table
    /// (`SparseOptions::alltoall_split`).
    Alltoall,
    /// (1.7) Starts on ps; on a cluster the daemons move the table to the route that
    /// moves the fewest bytes for the pulls they measure.
    Auto,
}

/// `px_split`: how `Route::Alltoall` divides the table between the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Node i holds the rows r with r % nodes == i (the default).
    Rows,
    /// Node i holds the i-th slice of every row's columns.
    Columns,
}

/// `px_nonfinite`: what a push with NaN/Inf gradients does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFinite {
    /// The push fails with `Status::Invalid` naming the row (the default).
    Reject,
    /// Those rows are dropped from the push.
    Skip,
}

/// `px_sparse_options` as a builder, starting from libparallax's defaults (SGD, lr 0.01,
/// zeros, sum, sync, automatic partitions, hybrid route — auto for a sync table, ps
/// otherwise —, NaN/Inf rejected). Every worker
/// must register a table with the same options.
#[derive(Clone, Copy, Debug)]
pub struct SparseOptions {
    raw: sys::px_sparse_options,
}

impl Default for SparseOptions {
    fn default() -> Self {
        SparseOptions::new()
    }
}

impl SparseOptions {
    /// The defaults (`px_sparse_options_init`).
    pub fn new() -> SparseOptions {
        let mut raw = sys::px_sparse_options::default();
        // SAFETY: a whole struct to fill.
        unsafe { sys::px_sparse_options_init(&mut raw) };
        SparseOptions { raw }
    }
    /// The optimizer.
    pub fn optimizer(mut self, optimizer: Optimizer) -> Self {
        self.raw.optimizer = match optimizer {
            Optimizer::Sgd => sys::PX_OPT_SGD,
            Optimizer::Adagrad => sys::PX_OPT_ADAGRAD,
            Optimizer::Adam => sys::PX_OPT_ADAM,
        };
        self
    }
    /// The learning rate (default 0.01).
    pub fn learning_rate(mut self, lr: f64) -> Self {
        self.raw.learning_rate = lr;
        self
    }
    /// Adam's beta1 (default 0.9).
    pub fn beta1(mut self, beta1: f64) -> Self {
        self.raw.beta1 = beta1;
        self
    }
    /// Adam's beta2 (default 0.999).
    pub fn beta2(mut self, beta2: f64) -> Self {
        self.raw.beta2 = beta2;
        self
    }
    /// Adagrad's and Adam's epsilon (default 1e-8).
    pub fn epsilon(mut self, epsilon: f64) -> Self {
        self.raw.epsilon = epsilon;
        self
    }
    /// Adagrad's initial accumulator (default 0.1).
    pub fn initial_accumulator(mut self, value: f64) -> Self {
        self.raw.initial_accumulator = value;
        self
    }
    /// The initial values.
    pub fn initializer(mut self, init: Initializer) -> Self {
        match init {
            Initializer::Zeros => self.raw.initializer = sys::PX_INIT_ZEROS,
            Initializer::Uniform { low, high } => {
                self.raw.initializer = sys::PX_INIT_UNIFORM;
                self.raw.init_low = low;
                self.raw.init_high = high;
            }
            Initializer::Normal { std } => {
                self.raw.initializer = sys::PX_INIT_NORMAL;
                self.raw.init_std = std;
            }
        }
        self
    }
    /// The initializer's seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.raw.init_seed = seed;
        self
    }
    /// How the workers' gradients of a row combine: `Sum` (default) or `Mean` (divided by
    /// the world size); the daemon refuses `Min` and `Max`.
    pub fn aggregation(mut self, op: ReduceOp) -> Self {
        self.raw.aggregation = op.raw();
        self
    }
    /// What a pull sees of earlier pushes.
    pub fn consistency(mut self, consistency: Consistency) -> Self {
        let (c, staleness) = match consistency {
            Consistency::Sync => (sys::PX_SYNC, 0),
            Consistency::Bounded(s) => (sys::PX_BOUNDED, s),
            Consistency::Async => (sys::PX_ASYNC, 0),
        };
        self.raw.consistency = c;
        self.raw.staleness = staleness;
        self
    }
    /// Partitions of the table; 0 (the default) lets the daemon choose from timed steps.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.raw.partitions = partitions;
        self
    }
    /// The route.
    pub fn route(mut self, route: Route) -> Self {
        self.raw.route = match route {
            Route::Hybrid => sys::PX_ROUTE_HYBRID,
            Route::Ps => sys::PX_ROUTE_PS,
            Route::Allgatherv => sys::PX_ROUTE_ALLGATHERV,
            Route::Allreduce => sys::PX_ROUTE_ALLREDUCE,
            Route::Alltoall => sys::PX_ROUTE_ALLTOALL,
            Route::Auto => sys::PX_ROUTE_AUTO,
        };
        self
    }
    /// How `Route::Alltoall` divides the table (rows by default).
    pub fn alltoall_split(mut self, split: Split) -> Self {
        self.raw.alltoall_split = match split {
            Split::Rows => sys::PX_SPLIT_ROWS,
            Split::Columns => sys::PX_SPLIT_COLUMNS,
        };
        self
    }
    /// What a push with NaN/Inf gradients does.
    pub fn nonfinite(mut self, policy: NonFinite) -> Self {
        self.raw.nonfinite = match policy {
            NonFinite::Reject => sys::PX_NONFINITE_REJECT,
            NonFinite::Skip => sys::PX_NONFINITE_SKIP,
        };
        self
    }
    /// The dtype of pulled rows and pushed gradients between nodes: `DType::F32` (the
    /// default) or, lossy, `DType::Bf16` / `DType::F16` (ps, hybrid and alltoall routes; the daemon
    /// refuses other dtypes).
    pub fn wire_dtype(mut self, dtype: DType) -> Self {
        self.raw.wire_dtype = dtype.raw();
        self
    }
    /// (ABI 1.6) With `true`, the next pull step may be issued ([`SparseVar::prefetch_rows`])
    /// before this push step, and its rows that no node pulled in this step are served at
    /// once, without waiting for this step's push (EmbRace's relaxed dependency). A worker's
    /// push step n may then only push rows its own pull step n pulled, else the push fails
    /// with `Status::Invalid` naming the row. Ps, hybrid and alltoall routes; `false` by
    /// default.
    pub fn prefetch(mut self, prefetch: bool) -> Self {
        self.raw.prefetch = prefetch as u32;
        self
    }
    /// (ABI 1.14) A hot-row cache on every node of up to `rows` rows owned by other nodes,
    /// each copy serving `staleness` pull steps while this node's gradients of it are held
    /// as long (`Consistency::Bounded` tables of the ps or hybrid route; docs/sparse.md,
    /// "The hot-row cache"). `rows` 0: none (the default).
    pub fn cache(mut self, rows: u32, staleness: u32) -> Self {
        self.raw.cache_rows = rows;
        self.raw.cache_staleness = staleness;
        self
    }
    /// Copies of each row kept (ABI 1.16): 2 keeps a copy of each node's partitions on the
    /// next node, so that a lost node's partitions are handed to the job's next run
    /// (membership on etcd, `Consistency::Sync`; docs/elastic.md). 1: none (the default).
    pub fn replicas(mut self, copies: u32) -> Self {
        self.raw.replicas = copies;
        self
    }
    /// The C struct.
    pub fn to_raw(&self) -> sys::px_sparse_options {
        self.raw
    }
}

/// A registered sparse `rows` x `dim` f32 table (`px_var`).
///
/// Pulls and pushes are numbered separately per worker: the n-th pull is pull step n, the
/// n-th push push step n, and every local worker issues each step (with no rows if it has
/// none). Loads and reads are not steps.
pub struct SparseVar<'c> {
    client: &'c Client,
    raw: *mut sys::px_var,
    name: String,
    rows: u64,
    dim: usize,
}

// SAFETY: a px_var is an id in libparallax's locked handle table, usable from any thread.
unsafe impl<'c> Send for SparseVar<'c> {}
unsafe impl<'c> Sync for SparseVar<'c> {}

impl<'c> SparseVar<'c> {
    pub(crate) fn new(
        client: &'c Client,
        raw: *mut sys::px_var,
        name: &str,
        rows: u64,
        dim: usize,
    ) -> Self {
        SparseVar {
            client,
            raw,
            name: name.to_owned(),
            rows,
            dim,
        }
    }

    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Rows of the table.
    pub fn rows(&self) -> u64 {
        self.rows
    }
    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The client it was registered on.
    pub fn client(&self) -> &'c Client {
        self.client
    }
    /// The raw handle, for calls this crate does not wrap.
    pub fn as_raw(&self) -> *mut sys::px_var {
        self.raw
    }
    /// The daemon's counters for this table on this node (`px_var_stats_get`).
    pub fn stats(&self) -> Result<VarStats> {
        stats(self.raw)
    }

    fn expect_rows(&self, what: &str, indices: usize, values: usize) -> Result<()> {
        match indices.checked_mul(self.dim) {
            Some(want) if want == values => Ok(()),
            _ => Err(Error::invalid(format!(
                "{}('{}'): {} indices need {} x {} = {} values, the buffer has {}",
                what,
                self.name,
                indices,
                indices,
                self.dim,
                indices.saturating_mul(self.dim),
                values
            ))),
        }
    }

    /// Pull step: `out` gets the rows' values, row i for `indices[i]` (`px_pull_rows`).
    /// An index outside `[0, rows)` fails the request with `Status::Index`.
    pub fn pull_rows<'a, O>(&'a self, indices: &'a [i64], out: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<f32> + ?Sized,
    {
        let o = out.out_parts()?;
        self.expect_rows("pull_rows", indices.len(), o.len)?;
        let opts = op_options(0);
        submit(o.busy, |r| unsafe {
            // SAFETY: n indices and n * dim values, borrowed for 'a.
            sys::px_pull_rows_ex(
                self.raw,
                indices.as_ptr(),
                indices.len() as u64,
                o.ptr as *mut c_void,
                &opts,
                r,
            )
        })
    }

    /// (ABI 1.6) The next pull step, issued ahead: exactly [`pull_rows`](Self::pull_rows)
    /// (`px_prefetch_rows`), typically before the push of the step in progress, on a table
    /// registered with [`SparseOptions::prefetch`] (else `Status::Invalid`). In `Sync` the
    /// result is the same as a pull issued after that push, never a stale row.
    pub fn prefetch_rows<'a, O>(&'a self, indices: &'a [i64], out: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<f32> + ?Sized,
    {
        let o = out.out_parts()?;
        self.expect_rows("prefetch_rows", indices.len(), o.len)?;
        let opts = op_options(0);
        submit(o.busy, |r| unsafe {
            // SAFETY: n indices and n * dim values, borrowed for 'a.
            sys::px_prefetch_rows_ex(
                self.raw,
                indices.as_ptr(),
                indices.len() as u64,
                o.ptr as *mut c_void,
                &opts,
                r,
            )
        })
    }

    /// Push step: gradients for the rows, duplicates summed (`px_push_rows`).
    pub fn push_rows<'a>(&'a self, indices: &'a [i64], grads: &'a [f32]) -> Result<Request<'a>> {
        self.expect_rows("push_rows", indices.len(), grads.len())?;
        let opts = op_options(0);
        submit(None, |r| unsafe {
            // SAFETY: n indices and n * dim values, borrowed for 'a.
            sys::px_push_rows_ex(
                self.raw,
                indices.as_ptr(),
                indices.len() as u64,
                grads.as_ptr() as *const c_void,
                &opts,
                r,
            )
        })
    }

    /// Overwrites the rows' values (`px_load_rows`); with duplicates the last one wins.
    pub fn load_rows<'a>(&'a self, indices: &'a [i64], values: &'a [f32]) -> Result<Request<'a>> {
        self.expect_rows("load_rows", indices.len(), values.len())?;
        let opts = op_options(0);
        submit(None, |r| unsafe {
            // SAFETY: n indices and n * dim values, borrowed for 'a.
            sys::px_load_rows_ex(
                self.raw,
                indices.as_ptr(),
                indices.len() as u64,
                values.as_ptr() as *const c_void,
                &opts,
                r,
            )
        })
    }

    /// Reads the rows' current values, not a step (`px_read_rows`).
    pub fn read_rows<'a, O>(&'a self, indices: &'a [i64], out: &'a mut O) -> Result<Request<'a>>
    where
        O: OutBuffer<f32> + ?Sized,
    {
        let o = out.out_parts()?;
        self.expect_rows("read_rows", indices.len(), o.len)?;
        let opts = op_options(0);
        submit(o.busy, |r| unsafe {
            // SAFETY: n indices and n * dim values, borrowed for 'a.
            sys::px_read_rows_ex(
                self.raw,
                indices.as_ptr(),
                indices.len() as u64,
                o.ptr as *mut c_void,
                &opts,
                r,
            )
        })
    }
}

impl<'c> std::fmt::Debug for SparseVar<'c> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseVar")
            .field("name", &self.name)
            .field("rows", &self.rows)
            .field("dim", &self.dim)
            .finish()
    }
}

/// (ABI 1.12) Tables that take their steps together (`px_register_sparse_group`): the
/// daemons hold them as one sparse variable, [`var`](Self::var), whose rows are the tables'
/// one after another; each of [`tables`](Self::tables) takes its own row numbers in every
/// operation, and [`pull_tables`](Self::pull_tables) / [`push_tables`](Self::push_tables)
/// make one step over several of them (a collection's lookups in one step).
pub struct SparseGroup<'c> {
    var: SparseVar<'c>,
    tables: Vec<SparseVar<'c>>,
}

impl<'c> SparseGroup<'c> {
    pub(crate) fn new(var: SparseVar<'c>, tables: Vec<SparseVar<'c>>) -> Self {
        SparseGroup { var, tables }
    }

    /// The group's own variable: its indices are the group's rows.
    pub fn var(&self) -> &SparseVar<'c> {
        &self.var
    }
    /// The tables, in registration order; each is named by its table's name.
    pub fn tables(&self) -> &[SparseVar<'c>] {
        &self.tables
    }
    /// The table of that name.
    pub fn table(&self, name: &str) -> Option<&SparseVar<'c>> {
        self.tables.iter().find(|t| t.name() == name)
    }

    /// The handles, counts and indices of (table, indices) parts, checked to be this
    /// group's tables; the number of rows.
    fn parts(&self, what: &str, parts: &[(&SparseVar<'c>, &[i64])]) -> Result<Parts> {
        let mut p = Parts::default();
        for (table, indices) in parts {
            if !self.tables.iter().any(|t| t.as_raw() == table.as_raw()) {
                return Err(Error::invalid(format!(
                    "{}('{}'): '{}' is not one of its tables",
                    what,
                    self.var.name(),
                    table.name()
                )));
            }
            p.handles.push(table.as_raw());
            p.counts.push(indices.len() as u64);
            p.indices.extend_from_slice(indices);
        }
        Ok(p)
    }

    /// One pull step over several tables (`px_pull_rows_group`): `out` gets the parts'
    /// rows one after another. A table's index outside its rows fails the request with
    /// `Status::Index` naming the table.
    pub fn pull_tables<'a, O>(
        &'a self,
        parts: &[(&SparseVar<'c>, &[i64])],
        out: &'a mut O,
    ) -> Result<Request<'a>>
    where
        O: OutBuffer<f32> + ?Sized,
    {
        let p = self.parts("pull_tables", parts)?;
        let o = out.out_parts()?;
        self.var
            .expect_rows("pull_tables", p.indices.len(), o.len)?;
        let opts = op_options(0);
        submit(o.busy, |r| unsafe {
            // SAFETY: n handles and counts, their indices (read during the call) and
            // sum(counts) * dim values borrowed for 'a.
            sys::px_pull_rows_group(
                p.handles.as_ptr(),
                p.handles.len() as u64,
                p.counts.as_ptr(),
                p.indices.as_ptr(),
                o.ptr as *mut c_void,
                &opts,
                r,
            )
        })
    }

    /// One push step over several tables (`px_push_rows_group`): gradients laid out as
    /// [`pull_tables`](Self::pull_tables)' rows.
    pub fn push_tables<'a>(
        &'a self,
        parts: &[(&SparseVar<'c>, &[i64])],
        grads: &'a [f32],
    ) -> Result<Request<'a>> {
        let p = self.parts("push_tables", parts)?;
        self.var
            .expect_rows("push_tables", p.indices.len(), grads.len())?;
        let opts = op_options(0);
        submit(None, |r| unsafe {
            // SAFETY: as pull_tables, the gradients borrowed for 'a.
            sys::px_push_rows_group(
                p.handles.as_ptr(),
                p.handles.len() as u64,
                p.counts.as_ptr(),
                p.indices.as_ptr(),
                grads.as_ptr() as *const c_void,
                &opts,
                r,
            )
        })
    }
}

#[derive(Default)]
struct Parts {
    handles: Vec<*mut sys::px_var>,
    counts: Vec<u64>,
    indices: Vec<i64>,
}

impl<'c> std::fmt::Debug for SparseGroup<'c> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseGroup")
            .field("var", &self.var)
            .field("tables", &self.tables)
            .finish()
    }
}
