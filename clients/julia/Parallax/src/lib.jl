# The raw C ABI of include/parallax_c.h (1.15), one function per px_* function, with the
# header's structs and enum values. clients/check_bindings.py compares every ccall,
# struct and constant here with the header (ctest clients/julia-bindings-match-header).
#
# Conventions: handles (px_client*, px_var*, px_request*) are Ptr{Cvoid}; C enums are
# Cint (32-bit in the ABI); out parameters are Ref; buffers are Ptr{Cvoid}, so any
# DenseArray (and an ArenaBuffer, via unsafe_convert) can be passed.

const PX_ABI_VERSION_MAJOR = 1
const PX_ABI_VERSION_MINOR = 16
const PX_ABI_VERSION = (PX_ABI_VERSION_MAJOR << 16) | PX_ABI_VERSION_MINOR
const PX_ARENA_MIN_BYTES = UInt64(1) << 20
const PX_ARENA_MAX_BYTES = UInt64(16) << 30

# px_status
const PX_OK = Cint(0)
const PX_ERR_INVALID = Cint(1)
const PX_ERR_VERSION = Cint(2)
const PX_ERR_CONNECT = Cint(3)
const PX_ERR_TIMEOUT = Cint(4)
const PX_ERR_PEER_LOST = Cint(5)
const PX_ERR_MISMATCH = Cint(6)
const PX_ERR_NOT_FOUND = Cint(7)
const PX_ERR_NO_MEMORY = Cint(8)
const PX_ERR_BUSY = Cint(9)
const PX_ERR_PROTOCOL = Cint(10)
const PX_ERR_INDEX = Cint(11)
const PX_ERR_NOT_IMPLEMENTED = Cint(12)
const PX_ERR_INTERNAL = Cint(13)
const PX_ERR_PERMISSION = Cint(14)
const PX_ERR_CANCELLED = Cint(15)
const PX_ERR_MEMBERSHIP = Cint(16)
const PX_STATUS_FORCE_32BIT = Cint(0x7fffffff)

# px_dtype
const PX_F32 = Cint(0)
const PX_F64 = Cint(1)
const PX_F16 = Cint(2)
const PX_BF16 = Cint(3)
const PX_I32 = Cint(4)
const PX_I64 = Cint(5)
const PX_DTYPE_FORCE_32BIT = Cint(0x7fffffff)

# px_reduce_op
const PX_SUM = Cint(0)
const PX_MEAN = Cint(1)
const PX_MIN = Cint(2)
const PX_MAX = Cint(3)
const PX_PROD = Cint(4)
const PX_REDUCE_OP_FORCE_32BIT = Cint(0x7fffffff)

# px_memory_kind
const PX_MEMORY_HOST = Cint(0)
const PX_MEMORY_CUDA = Cint(1)
const PX_MEMORY_KIND_FORCE_32BIT = Cint(0x7fffffff)

# px_optimizer
const PX_OPT_SGD = Cint(0)
const PX_OPT_ADAGRAD = Cint(1)
const PX_OPT_ADAM = Cint(2)
const PX_OPTIMIZER_FORCE_32BIT = Cint(0x7fffffff)

# px_initializer
const PX_INIT_ZEROS = Cint(0)
const PX_INIT_UNIFORM = Cint(1)
const PX_INIT_NORMAL = Cint(2)
const PX_INITIALIZER_FORCE_32BIT = Cint(0x7fffffff)

# px_consistency
const PX_SYNC = Cint(0)
const PX_ASYNC = Cint(1)
const PX_BOUNDED = Cint(2)
const PX_CONSISTENCY_FORCE_32BIT = Cint(0x7fffffff)

# px_route
const PX_ROUTE_HYBRID = Cint(0)
const PX_ROUTE_PS = Cint(1)
const PX_ROUTE_ALLGATHERV = Cint(2)
const PX_ROUTE_ALLREDUCE = Cint(3)
const PX_ROUTE_ALLTOALL = Cint(4)
const PX_ROUTE_AUTO = Cint(5)
const PX_ROUTE_FORCE_32BIT = Cint(0x7fffffff)

# px_nonfinite
const PX_NONFINITE_REJECT = Cint(0)
const PX_NONFINITE_SKIP = Cint(1)
const PX_NONFINITE_FORCE_32BIT = Cint(0x7fffffff)

# px_split
const PX_SPLIT_ROWS = Cint(0)
const PX_SPLIT_COLUMNS = Cint(1)
const PX_SPLIT_FORCE_32BIT = Cint(0x7fffffff)

# Immutable isbits structs, laid out as C lays out the header's (sizes in the comments).
struct PxConnectOptions  # 56 bytes
    struct_size::UInt32
    abi_version::UInt32
    socket_path::Ptr{UInt8}
    job_name::Ptr{UInt8}
    local_rank::Int32
    local_size::Int32
    timeout_ms::Int64
    arena_bytes::UInt64
    wait_for_daemon::Int32
    reserved::UInt32
end

struct PxLaunchInfo  # 40 bytes (1.10)
    struct_size::UInt32
    local_rank::Int32
    local_size::Int32
    rank::Int32
    launcher::Ptr{UInt8}
    job_name::Ptr{UInt8}
    socket_path::Ptr{UInt8}
end

struct PxOpOptions  # 32 bytes
    struct_size::UInt32
    memory_kind::Int32
    device::Int32
    priority::Int32
    stream::Ptr{Cvoid}
    root::Int32
    reserved::UInt32
end

struct PxAllocOptions  # 16 bytes
    struct_size::UInt32
    memory_kind::Int32
    device::Int32
    reserved::UInt32
end

struct PxWorldInfo  # 28 bytes
    struct_size::UInt32
    node_index::Int32
    node_count::Int32
    rank::Int32
    world_size::Int32
    local_rank::Int32
    local_size::Int32
end

struct PxVarStats  # 128 bytes
    struct_size::UInt32
    reserved::UInt32
    ops::UInt64
    bytes::UInt64
    wait_ns::UInt64
    reduce_ns::UInt64
    pull_steps::UInt64
    push_steps::UInt64
    rows_pulled::UInt64
    rows_unique::UInt64
    rows_applied::UInt64
    bytes_sent::UInt64
    bytes_received::UInt64
    request_partitions::UInt64
    search_steps_left::UInt64
    restored_steps::UInt64
    rows_served_ahead::UInt64
    cache_hits::UInt64  # 1.14: a hot-row cache's counters
    cache_misses::UInt64
    cache_rows::UInt64
    cache_bytes_saved::UInt64
    cache_rows_flushed::UInt64
end

struct PxDenseOptions  # 8 bytes
    struct_size::UInt32
    wire_dtype::Int32
end

struct PxSparseOptions  # 128 bytes
    struct_size::UInt32
    optimizer::Int32
    learning_rate::Float64
    beta1::Float64
    beta2::Float64
    epsilon::Float64
    initial_accumulator::Float64
    initializer::Int32
    reserved0::UInt32
    init_seed::UInt64
    init_low::Float64
    init_high::Float64
    init_std::Float64
    aggregation::Int32
    consistency::Int32
    staleness::UInt32
    partitions::UInt32
    route::Int32
    nonfinite::Int32
    alltoall_split::Int32
    wire_dtype::Int32
    prefetch::UInt32
    reserved1::UInt32
    cache_rows::UInt32  # 1.14: a hot-row cache
    cache_staleness::UInt32
    replicas::UInt32  # 1.16: copies of each node's partitions on the next node
    reserved2::UInt32
end

# A copy of an immutable struct with some fields replaced: with(o; root = 2).
function with(x::T; fields...) where {T}
    values = map(fieldnames(T)) do f
        haskey(fields, f) ? convert(fieldtype(T, f), fields[f]) : getfield(x, f)
    end
    return T(values...)
end

# The library: "libparallax" on the loader's path, or $PARALLAX_LIB (a path), read when the
# module is loaded (__init__). A function call as ccall's library is evaluated at run time.
const LIBPARALLAX = Ref("libparallax")
libparallax() = LIBPARALLAX[]

# --- versions and errors -------------------------------------------------------------
px_abi_version() = ccall((:px_abi_version, libparallax()), UInt32, ())
px_strerror(status) = ccall((:px_strerror, libparallax()), Cstring, (Cint,), status)
px_status_name(status) = ccall((:px_status_name, libparallax()), Cstring, (Cint,), status)
px_last_error() = ccall((:px_last_error, libparallax()), Cstring, ())

# --- connection ----------------------------------------------------------------------
px_connect_options_init_abi(o::Ref{PxConnectOptions}, caller_abi::Integer) =
    ccall((:px_connect_options_init_abi, libparallax()), Cvoid, (Ref{PxConnectOptions}, UInt32),
          o, caller_abi)
px_connect(o::Ref{PxConnectOptions}, out::Ref{Ptr{Cvoid}}) =
    ccall((:px_connect, libparallax()), Cint, (Ref{PxConnectOptions}, Ref{Ptr{Cvoid}}), o, out)
px_launch_info_from_env(out::Ref{PxLaunchInfo}) =
    ccall((:px_launch_info_from_env, libparallax()), Cint, (Ref{PxLaunchInfo},), out)
px_disconnect(c::Ptr{Cvoid}) = ccall((:px_disconnect, libparallax()), Cint, (Ptr{Cvoid},), c)
px_world(c::Ptr{Cvoid}, out::Ref{PxWorldInfo}) =
    ccall((:px_world, libparallax()), Cint, (Ptr{Cvoid}, Ref{PxWorldInfo}), c, out)
px_client_last_error(c::Ptr{Cvoid}, buffer, size::Integer, out_length::Ref{UInt64}) =
    ccall((:px_client_last_error, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{UInt8}, UInt64, Ref{UInt64}), c, buffer, size, out_length)
px_abort(c::Ptr{Cvoid}, reason::AbstractString) =
    ccall((:px_abort, libparallax()), Cint, (Ptr{Cvoid}, Cstring), c, reason)
px_client_fd(c::Ptr{Cvoid}, out::Ref{Cint}) =
    ccall((:px_client_fd, libparallax()), Cint, (Ptr{Cvoid}, Ref{Cint}), c, out)
px_progress(c::Ptr{Cvoid}) = ccall((:px_progress, libparallax()), Cint, (Ptr{Cvoid},), c)

# --- variables -----------------------------------------------------------------------
px_register_dense(c::Ptr{Cvoid}, name::AbstractString, dtype, count::Integer, op,
                  out::Ref{Ptr{Cvoid}}) =
    ccall((:px_register_dense, libparallax()), Cint,
          (Ptr{Cvoid}, Cstring, Cint, UInt64, Cint, Ref{Ptr{Cvoid}}),
          c, name, dtype, count, op, out)
px_var_stats_get(v::Ptr{Cvoid}, out::Ref{PxVarStats}) =
    ccall((:px_var_stats_get, libparallax()), Cint, (Ptr{Cvoid}, Ref{PxVarStats}), v, out)
# (1.13) A dense variable's options (a 16-bit wire).
px_dense_options_init(o::Ref{PxDenseOptions}) =
    ccall((:px_dense_options_init, libparallax()), Cvoid, (Ref{PxDenseOptions},), o)
px_register_dense_ex(c::Ptr{Cvoid}, name::AbstractString, dtype, count::Integer, op,
                     o::Ref{PxDenseOptions}, out::Ref{Ptr{Cvoid}}) =
    ccall((:px_register_dense_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Cstring, Cint, UInt64, Cint, Ref{PxDenseOptions}, Ref{Ptr{Cvoid}}),
          c, name, dtype, count, op, o, out)
px_sparse_options_init(o::Ref{PxSparseOptions}) =
    ccall((:px_sparse_options_init, libparallax()), Cvoid, (Ref{PxSparseOptions},), o)
px_register_sparse(c::Ptr{Cvoid}, name::AbstractString, dtype, rows::Integer, dim::Integer,
                   o::Ref{PxSparseOptions}, out::Ref{Ptr{Cvoid}}) =
    ccall((:px_register_sparse, libparallax()), Cint,
          (Ptr{Cvoid}, Cstring, Cint, UInt64, UInt64, Ref{PxSparseOptions}, Ref{Ptr{Cvoid}}),
          c, name, dtype, rows, dim, o, out)
# (1.11) The learning rate from this worker's next push step on.
px_set_sparse_lr(v::Ptr{Cvoid}, lr::Real) =
    ccall((:px_set_sparse_lr, libparallax()), Cint, (Ptr{Cvoid}, Cdouble), v, lr)
# (1.12) A group of tables that take their steps together.
px_register_sparse_group(c::Ptr{Cvoid}, name::AbstractString, dtype, n_tables::Integer,
                         table_names, table_rows, dim::Integer, o::Ref{PxSparseOptions},
                         out_group::Ref{Ptr{Cvoid}}, out_tables) =
    ccall((:px_register_sparse_group, libparallax()), Cint,
          (Ptr{Cvoid}, Cstring, Cint, UInt64, Ptr{Ptr{UInt8}}, Ptr{UInt64}, UInt64,
           Ref{PxSparseOptions}, Ref{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}),
          c, name, dtype, n_tables, table_names, table_rows, dim, o, out_group, out_tables)

# --- shared memory -------------------------------------------------------------------
px_alloc(c::Ptr{Cvoid}, bytes::Integer, out::Ref{Ptr{Cvoid}}) =
    ccall((:px_alloc, libparallax()), Cint, (Ptr{Cvoid}, UInt64, Ref{Ptr{Cvoid}}), c, bytes, out)
px_free(c::Ptr{Cvoid}, p::Ptr{Cvoid}) =
    ccall((:px_free, libparallax()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}), c, p)
px_alloc_options_init(o::Ref{PxAllocOptions}) =
    ccall((:px_alloc_options_init, libparallax()), Cvoid, (Ref{PxAllocOptions},), o)
px_alloc_ex(c::Ptr{Cvoid}, bytes::Integer, o::Ref{PxAllocOptions}, out::Ref{Ptr{Cvoid}}) =
    ccall((:px_alloc_ex, libparallax()), Cint,
          (Ptr{Cvoid}, UInt64, Ref{PxAllocOptions}, Ref{Ptr{Cvoid}}), c, bytes, o, out)

# --- operations ----------------------------------------------------------------------
px_op_options_init(o::Ref{PxOpOptions}) =
    ccall((:px_op_options_init, libparallax()), Cvoid, (Ref{PxOpOptions},), o)
px_allreduce(v, input, output, out) =
    ccall((:px_allreduce, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, input, output, out)
px_allreduce_ex(v, input, output, o::Ref{PxOpOptions}, out) =
    ccall((:px_allreduce_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, input, output, o, out)
px_broadcast(v, input, output, out) =
    ccall((:px_broadcast, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, input, output, out)
px_broadcast_ex(v, input, output, o::Ref{PxOpOptions}, out) =
    ccall((:px_broadcast_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, input, output, o, out)
px_allgather(v, input, output, out) =
    ccall((:px_allgather, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, input, output, out)
px_allgather_ex(v, input, output, o::Ref{PxOpOptions}, out) =
    ccall((:px_allgather_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, input, output, o, out)
px_allgatherv(v, input, counts, output, out) =
    ccall((:px_allgatherv, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{UInt64}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}),
          v, input, counts, output, out)
px_allgatherv_ex(v, input, counts, output, o::Ref{PxOpOptions}, out) =
    ccall((:px_allgatherv_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{UInt64}, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, input, counts, output, o, out)
px_reduce_scatter(v, input, output, out) =
    ccall((:px_reduce_scatter, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, input, output, out)
px_reduce_scatter_ex(v, input, output, o::Ref{PxOpOptions}, out) =
    ccall((:px_reduce_scatter_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, input, output, o, out)
px_alltoall(v, input, output, out) =
    ccall((:px_alltoall, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, input, output, out)
px_alltoall_ex(v, input, output, o::Ref{PxOpOptions}, out) =
    ccall((:px_alltoall_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, input, output, o, out)
px_alltoallv(v, input, send_counts, output, recv_counts, out) =
    ccall((:px_alltoallv, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{UInt64}, Ptr{Cvoid}, Ptr{UInt64}, Ref{Ptr{Cvoid}}),
          v, input, send_counts, output, recv_counts, out)
px_alltoallv_ex(v, input, send_counts, output, recv_counts, o::Ref{PxOpOptions}, out) =
    ccall((:px_alltoallv_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{UInt64}, Ptr{Cvoid}, Ptr{UInt64}, Ref{PxOpOptions},
           Ref{Ptr{Cvoid}}),
          v, input, send_counts, output, recv_counts, o, out)
px_checkpoint(c::Ptr{Cvoid}, path::AbstractString, timeout_ms::Integer) =
    ccall((:px_checkpoint, libparallax()), Cint, (Ptr{Cvoid}, Cstring, Int64), c, path, timeout_ms)

# --- sparse operations ---------------------------------------------------------------
px_pull_rows(v, indices, n, rows, out) =
    ccall((:px_pull_rows, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, indices, n, rows, out)
px_pull_rows_ex(v, indices, n, rows, o::Ref{PxOpOptions}, out) =
    ccall((:px_pull_rows_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, indices, n, rows, o, out)
px_prefetch_rows(v, indices, n, rows, out) =
    ccall((:px_prefetch_rows, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, indices, n, rows, out)
px_prefetch_rows_ex(v, indices, n, rows, o::Ref{PxOpOptions}, out) =
    ccall((:px_prefetch_rows_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, indices, n, rows, o, out)
px_push_rows(v, indices, n, grads, out) =
    ccall((:px_push_rows, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, indices, n, grads, out)
px_push_rows_ex(v, indices, n, grads, o::Ref{PxOpOptions}, out) =
    ccall((:px_push_rows_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, indices, n, grads, o, out)
px_load_rows(v, indices, n, rows, out) =
    ccall((:px_load_rows, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, indices, n, rows, out)
px_load_rows_ex(v, indices, n, rows, o::Ref{PxOpOptions}, out) =
    ccall((:px_load_rows_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, indices, n, rows, o, out)
px_read_rows(v, indices, n, rows, out) =
    ccall((:px_read_rows, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{Ptr{Cvoid}}), v, indices, n, rows, out)
px_read_rows_ex(v, indices, n, rows, o::Ref{PxOpOptions}, out) =
    ccall((:px_read_rows_ex, libparallax()), Cint,
          (Ptr{Cvoid}, Ptr{Int64}, UInt64, Ptr{Cvoid}, Ref{PxOpOptions}, Ref{Ptr{Cvoid}}),
          v, indices, n, rows, o, out)
# (1.12) One step of a group over several of its tables.
px_pull_rows_group(tables, n, counts, indices, rows, o::Ref{PxOpOptions}, out) =
    ccall((:px_pull_rows_group, libparallax()), Cint,
          (Ptr{Ptr{Cvoid}}, UInt64, Ptr{UInt64}, Ptr{Int64}, Ptr{Cvoid}, Ref{PxOpOptions},
           Ref{Ptr{Cvoid}}), tables, n, counts, indices, rows, o, out)
px_prefetch_rows_group(tables, n, counts, indices, rows, o::Ref{PxOpOptions}, out) =
    ccall((:px_prefetch_rows_group, libparallax()), Cint,
          (Ptr{Ptr{Cvoid}}, UInt64, Ptr{UInt64}, Ptr{Int64}, Ptr{Cvoid}, Ref{PxOpOptions},
           Ref{Ptr{Cvoid}}), tables, n, counts, indices, rows, o, out)
px_push_rows_group(tables, n, counts, indices, grads, o::Ref{PxOpOptions}, out) =
    ccall((:px_push_rows_group, libparallax()), Cint,
          (Ptr{Ptr{Cvoid}}, UInt64, Ptr{UInt64}, Ptr{Int64}, Ptr{Cvoid}, Ref{PxOpOptions},
           Ref{Ptr{Cvoid}}), tables, n, counts, indices, grads, o, out)

# --- completion ----------------------------------------------------------------------
px_wait(r::Ptr{Cvoid}, timeout_ms::Integer) =
    ccall((:px_wait, libparallax()), Cint, (Ptr{Cvoid}, Int64), r, timeout_ms)
px_test(r::Ptr{Cvoid}, done::Ref{Int32}) =
    ccall((:px_test, libparallax()), Cint, (Ptr{Cvoid}, Ref{Int32}), r, done)
px_wait_all(requests::Vector{Ptr{Cvoid}}, timeout_ms::Integer) =
    ccall((:px_wait_all, libparallax()), Cint, (Ptr{Ptr{Cvoid}}, UInt64, Int64),
          requests, length(requests), timeout_ms)
px_request_free(r::Ptr{Cvoid}) = ccall((:px_request_free, libparallax()), Cint, (Ptr{Cvoid},), r)
px_request_error(r::Ptr{Cvoid}) =
    ccall((:px_request_error, libparallax()), Cstring, (Ptr{Cvoid},), r)
px_request_cancel(r::Ptr{Cvoid}) =
    ccall((:px_request_cancel, libparallax()), Cint, (Ptr{Cvoid},), r)
px_barrier(c::Ptr{Cvoid}, timeout_ms::Integer) =
    ccall((:px_barrier, libparallax()), Cint, (Ptr{Cvoid}, Int64), c, timeout_ms)
