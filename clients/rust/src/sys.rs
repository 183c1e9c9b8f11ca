//! Raw declarations of `include/parallax_c.h` (ABI 1.15), one for one.
//!
//! `clients/check_bindings.py` compares every function, struct and enum value here with the
//! header (ctest `clients/rust-bindings-match-header`), so edit both together. C enums are
//! 32-bit ints in the ABI (each has a 0x7fffffff member), so they are `i32` aliases with
//! constants here rather than Rust enums: a value this crate does not know (a newer daemon's
//! status) must not be undefined behaviour.
#![allow(non_camel_case_types, missing_docs)]

use std::os::raw::{c_char, c_int, c_void};

pub const PX_ABI_VERSION_MAJOR: u32 = 1;
pub const PX_ABI_VERSION_MINOR: u32 = 16;
pub const PX_ABI_VERSION: u32 = (PX_ABI_VERSION_MAJOR << 16) | PX_ABI_VERSION_MINOR;

pub const PX_ARENA_MIN_BYTES: u64 = 1 << 20;
pub const PX_ARENA_MAX_BYTES: u64 = 16 << 30;

pub type px_status = i32;
pub const PX_OK: px_status = 0;
pub const PX_ERR_INVALID: px_status = 1;
pub const PX_ERR_VERSION: px_status = 2;
pub const PX_ERR_CONNECT: px_status = 3;
pub const PX_ERR_TIMEOUT: px_status = 4;
pub const PX_ERR_PEER_LOST: px_status = 5;
pub const PX_ERR_MISMATCH: px_status = 6;
pub const PX_ERR_NOT_FOUND: px_status = 7;
pub const PX_ERR_NO_MEMORY: px_status = 8;
pub const PX_ERR_BUSY: px_status = 9;
pub const PX_ERR_PROTOCOL: px_status = 10;
pub const PX_ERR_INDEX: px_status = 11;
pub const PX_ERR_NOT_IMPLEMENTED: px_status = 12;
pub const PX_ERR_INTERNAL: px_status = 13;
pub const PX_ERR_PERMISSION: px_status = 14;
pub const PX_ERR_CANCELLED: px_status = 15;
pub const PX_ERR_MEMBERSHIP: px_status = 16;
pub const PX_STATUS_FORCE_32BIT: px_status = 0x7fffffff;

pub type px_dtype = i32;
pub const PX_F32: px_dtype = 0;
pub const PX_F64: px_dtype = 1;
pub const PX_F16: px_dtype = 2;
pub const PX_BF16: px_dtype = 3;
pub const PX_I32: px_dtype = 4;
pub const PX_I64: px_dtype = 5;
pub const PX_DTYPE_FORCE_32BIT: px_dtype = 0x7fffffff;

pub type px_reduce_op = i32;
pub const PX_SUM: px_reduce_op = 0;
pub const PX_MEAN: px_reduce_op = 1;
pub const PX_MIN: px_reduce_op = 2;
pub const PX_MAX: px_reduce_op = 3;
pub const PX_PROD: px_reduce_op = 4;
pub const PX_REDUCE_OP_FORCE_32BIT: px_reduce_op = 0x7fffffff;

pub type px_memory_kind = i32;
pub const PX_MEMORY_HOST: px_memory_kind = 0;
pub const PX_MEMORY_CUDA: px_memory_kind = 1;
pub const PX_MEMORY_KIND_FORCE_32BIT: px_memory_kind = 0x7fffffff;

pub type px_optimizer = i32;
pub const PX_OPT_SGD: px_optimizer = 0;
pub const PX_OPT_ADAGRAD: px_optimizer = 1;
pub const PX_OPT_ADAM: px_optimizer = 2;
pub const PX_OPTIMIZER_FORCE_32BIT: px_optimizer = 0x7fffffff;

pub type px_initializer = i32;
pub const PX_INIT_ZEROS: px_initializer = 0;
pub const PX_INIT_UNIFORM: px_initializer = 1;
pub const PX_INIT_NORMAL: px_initializer = 2;
pub const PX_INITIALIZER_FORCE_32BIT: px_initializer = 0x7fffffff;

pub type px_consistency = i32;
pub const PX_SYNC: px_consistency = 0;
pub const PX_ASYNC: px_consistency = 1;
pub const PX_BOUNDED: px_consistency = 2;
pub const PX_CONSISTENCY_FORCE_32BIT: px_consistency = 0x7fffffff;

pub type px_route = i32;
pub const PX_ROUTE_HYBRID: px_route = 0;
pub const PX_ROUTE_PS: px_route = 1;
pub const PX_ROUTE_ALLGATHERV: px_route = 2;
pub const PX_ROUTE_ALLREDUCE: px_route = 3;
pub const PX_ROUTE_ALLTOALL: px_route = 4;
pub const PX_ROUTE_AUTO: px_route = 5;
pub const PX_ROUTE_FORCE_32BIT: px_route = 0x7fffffff;

pub type px_nonfinite = i32;
pub const PX_NONFINITE_REJECT: px_nonfinite = 0;
pub const PX_NONFINITE_SKIP: px_nonfinite = 1;
pub const PX_NONFINITE_FORCE_32BIT: px_nonfinite = 0x7fffffff;

pub type px_split = i32;
pub const PX_SPLIT_ROWS: px_split = 0;
pub const PX_SPLIT_COLUMNS: px_split = 1;
pub const PX_SPLIT_FORCE_32BIT: px_split = 0x7fffffff;

// Opaque handles: never dereferenced, only passed back (they are ids in libparallax).
#[repr(C)]
pub struct px_client {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct px_var {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct px_request {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct px_connect_options {
    pub struct_size: u32,
    pub abi_version: u32,
    pub socket_path: *const c_char,
    pub job_name: *const c_char,
    pub local_rank: i32,
    pub local_size: i32,
    pub timeout_ms: i64,
    pub arena_bytes: u64,
    pub wait_for_daemon: i32,
    pub reserved: u32,
}

// 1.10: what px_connect reads from the environment (launchers' variables).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct px_launch_info {
    pub struct_size: u32,
    pub local_rank: i32,
    pub local_size: i32,
    pub rank: i32,
    pub launcher: *const c_char,
    pub job_name: *const c_char,
    pub socket_path: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct px_op_options {
    pub struct_size: u32,
    pub memory_kind: i32,
    pub device: i32,
    pub priority: i32,
    pub stream: *mut c_void,
    pub root: i32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct px_alloc_options {
    pub struct_size: u32,
    pub memory_kind: i32,
    pub device: i32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct px_world_info {
    pub struct_size: u32,
    pub node_index: i32,
    pub node_count: i32,
    pub rank: i32,
    pub world_size: i32,
    pub local_rank: i32,
    pub local_size: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct px_var_stats {
    pub struct_size: u32,
    pub reserved: u32,
    pub ops: u64,
    pub bytes: u64,
    pub wait_ns: u64,
    pub reduce_ns: u64,
    pub pull_steps: u64,
    pub push_steps: u64,
    pub rows_pulled: u64,
    pub rows_unique: u64,
    pub rows_applied: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub request_partitions: u64,
    pub search_steps_left: u64,
    pub restored_steps: u64,
    pub rows_served_ahead: u64,
    // 1.14: a hot-row cache's counters.
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_rows: u64,
    pub cache_bytes_saved: u64,
    pub cache_rows_flushed: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct px_dense_options {
    pub struct_size: u32,
    pub wire_dtype: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct px_sparse_options {
    pub struct_size: u32,
    pub optimizer: i32,
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub initial_accumulator: f64,
    pub initializer: i32,
    pub reserved0: u32,
    pub init_seed: u64,
    pub init_low: f64,
    pub init_high: f64,
    pub init_std: f64,
    pub aggregation: i32,
    pub consistency: i32,
    pub staleness: u32,
    pub partitions: u32,
    pub route: i32,
    pub nonfinite: i32,
    pub alltoall_split: i32,
    pub wire_dtype: i32,
    pub prefetch: u32,
    pub reserved1: u32,
    // 1.14: a hot-row cache.
    pub cache_rows: u32,
    pub cache_staleness: u32,
    // 1.16: copies of each node's partitions on the next node.
    pub replicas: u32,
    pub reserved2: u32,
}

extern "C" {
    // versions and errors
    pub fn px_abi_version() -> u32;
    pub fn px_strerror(status: px_status) -> *const c_char;
    pub fn px_status_name(status: px_status) -> *const c_char;
    pub fn px_last_error() -> *const c_char;

    // connection
    pub fn px_connect_options_init_abi(options: *mut px_connect_options, caller_abi: u32);
    pub fn px_connect(
        options: *const px_connect_options,
        out_client: *mut *mut px_client,
    ) -> px_status;
    pub fn px_launch_info_from_env(out_info: *mut px_launch_info) -> px_status;
    pub fn px_disconnect(client: *mut px_client) -> px_status;
    pub fn px_world(client: *mut px_client, out_info: *mut px_world_info) -> px_status;
    pub fn px_client_last_error(
        client: *mut px_client,
        buffer: *mut c_char,
        size: u64,
        out_length: *mut u64,
    ) -> px_status;
    pub fn px_abort(client: *mut px_client, reason: *const c_char) -> px_status;
    pub fn px_client_fd(client: *mut px_client, out_fd: *mut c_int) -> px_status;
    pub fn px_progress(client: *mut px_client) -> px_status;

    // variables
    pub fn px_register_dense(
        client: *mut px_client,
        name: *const c_char,
        dtype: px_dtype,
        count: u64,
        op: px_reduce_op,
        out_var: *mut *mut px_var,
    ) -> px_status;
    pub fn px_var_stats_get(var: *mut px_var, out_stats: *mut px_var_stats) -> px_status;
    // 1.13: a dense variable's options (a 16-bit wire).
    pub fn px_dense_options_init(options: *mut px_dense_options);
    pub fn px_register_dense_ex(
        client: *mut px_client,
        name: *const c_char,
        dtype: px_dtype,
        count: u64,
        op: px_reduce_op,
        options: *const px_dense_options,
        out_var: *mut *mut px_var,
    ) -> px_status;
    pub fn px_sparse_options_init(options: *mut px_sparse_options);
    pub fn px_register_sparse(
        client: *mut px_client,
        name: *const c_char,
        dtype: px_dtype,
        rows: u64,
        dim: u64,
        options: *const px_sparse_options,
        out_var: *mut *mut px_var,
    ) -> px_status;
    // 1.11: a sparse variable's learning rate from this worker's next push step on.
    pub fn px_set_sparse_lr(var: *mut px_var, learning_rate: f64) -> px_status;
    // 1.12: a group of tables that take their steps together.
    pub fn px_register_sparse_group(
        client: *mut px_client,
        name: *const c_char,
        dtype: px_dtype,
        n_tables: u64,
        table_names: *const *const c_char,
        table_rows: *const u64,
        dim: u64,
        options: *const px_sparse_options,
        out_group: *mut *mut px_var,
        out_tables: *mut *mut px_var,
    ) -> px_status;

    // shared memory
    pub fn px_alloc(client: *mut px_client, bytes: u64, out_ptr: *mut *mut c_void) -> px_status;
    pub fn px_free(client: *mut px_client, ptr: *mut c_void) -> px_status;
    pub fn px_alloc_options_init(options: *mut px_alloc_options);
    pub fn px_alloc_ex(
        client: *mut px_client,
        bytes: u64,
        options: *const px_alloc_options,
        out_ptr: *mut *mut c_void,
    ) -> px_status;

    // operations
    pub fn px_op_options_init(options: *mut px_op_options);
    pub fn px_allreduce(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_allreduce_ex(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_broadcast(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_broadcast_ex(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_allgather(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_allgather_ex(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_allgatherv(
        var: *mut px_var,
        input: *const c_void,
        counts: *const u64,
        out: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_allgatherv_ex(
        var: *mut px_var,
        input: *const c_void,
        counts: *const u64,
        out: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_reduce_scatter(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_reduce_scatter_ex(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_alltoall(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_alltoall_ex(
        var: *mut px_var,
        input: *const c_void,
        out: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_alltoallv(
        var: *mut px_var,
        input: *const c_void,
        send_counts: *const u64,
        out: *mut c_void,
        recv_counts: *const u64,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_alltoallv_ex(
        var: *mut px_var,
        input: *const c_void,
        send_counts: *const u64,
        out: *mut c_void,
        recv_counts: *const u64,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_checkpoint(client: *mut px_client, path: *const c_char, timeout_ms: i64)
        -> px_status;

    // sparse operations
    pub fn px_pull_rows(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        out_rows: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_pull_rows_ex(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        out_rows: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_prefetch_rows(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        out_rows: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_prefetch_rows_ex(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        out_rows: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_push_rows(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        grads: *const c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_push_rows_ex(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        grads: *const c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_load_rows(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        rows: *const c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_load_rows_ex(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        rows: *const c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_read_rows(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        out_rows: *mut c_void,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_read_rows_ex(
        var: *mut px_var,
        indices: *const i64,
        n: u64,
        out_rows: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    // 1.12: one step of a group over several of its tables.
    pub fn px_pull_rows_group(
        tables: *const *mut px_var,
        n: u64,
        counts: *const u64,
        indices: *const i64,
        out_rows: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_prefetch_rows_group(
        tables: *const *mut px_var,
        n: u64,
        counts: *const u64,
        indices: *const i64,
        out_rows: *mut c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;
    pub fn px_push_rows_group(
        tables: *const *mut px_var,
        n: u64,
        counts: *const u64,
        indices: *const i64,
        grads: *const c_void,
        options: *const px_op_options,
        out_request: *mut *mut px_request,
    ) -> px_status;

    // completion
    pub fn px_wait(request: *mut px_request, timeout_ms: i64) -> px_status;
    pub fn px_test(request: *mut px_request, out_done: *mut i32) -> px_status;
    pub fn px_wait_all(requests: *const *mut px_request, n: u64, timeout_ms: i64) -> px_status;
    pub fn px_request_free(request: *mut px_request) -> px_status;
    pub fn px_request_error(request: *mut px_request) -> *const c_char;
    pub fn px_request_cancel(request: *mut px_request) -> px_status;
    pub fn px_barrier(client: *mut px_client, timeout_ms: i64) -> px_status;
}
