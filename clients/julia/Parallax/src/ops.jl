# Variables, their operations, and requests.

# --- requests ------------------------------------------------------------------------
"""
    Request

A submitted operation (`px_request`). It holds the operation's buffers, so they stay
alive until it is closed; do not touch them until it completed. `wait(r; timeout)`,
`isready(r)`, [`cancel!`](@ref), [`wait_async`](@ref); `close(r)` cancels it if it has not
completed (a step other local workers wait for then fails for them, naming this worker)
and frees it. A request collected by the GC is only freed (a finalizer must not block on
a cancel): its step goes on for the others, and an arena output stays locked.
"""
mutable struct Request
    handle::Ptr{Cvoid}
    client::Client
    buffers::Tuple                      # the operation's memory, kept alive
    arena::Union{Nothing,ArenaBuffer}   # the arena output, counted busy until settled
    settled::Bool                       # nothing writes its output any more
    freed::Threads.Atomic{Bool}
end

function Request(handle::Ptr{Cvoid}, client::Client, buffers::Tuple, arena)
    r = Request(handle, client, buffers, arena, false, Threads.Atomic{Bool}(false))
    return finalizer(r) do r
        Threads.atomic_xchg!(r.freed, true) || px_request_free(r.handle)
    end
end

function settle!(r::Request)
    r.settled && return nothing
    r.settled = true
    r.arena === nothing || Threads.atomic_sub!(r.arena.busy, 1)
    return nothing
end

function open_handle(r::Request)
    r.freed[] && throw(ArgumentError("the Request was closed"))
    return r.handle
end

# The operation's error: its own message (kept by the request, whichever thread waited),
# else the failed call's (px_last_error, read first: it is this thread's latest).
function request_error(r::Request, status::Cint)
    call_message = unsafe_string(px_last_error())
    message = unsafe_string(px_request_error(r.handle))
    return ParallaxError(status, isempty(message) ? call_message : message)
end

"""
    wait(r::Request; timeout = 30)

Waits up to `timeout` seconds for the operation; throws a [`ParallaxError`](@ref) if it
failed, or with `PX_ERR_TIMEOUT` if it is still running (it stays valid: wait again or
close it). Waits in slices of 50 ms with a `yield()` between, so other tasks of this
thread run and the GC can stop this thread.
"""
function Base.wait(r::Request; timeout::Real = 30.0)
    h = open_handle(r)
    deadline = time() + timeout
    while true
        slice = clamp(deadline - time(), 0.0, 0.05)
        status = px_wait(h, timeout_ms(slice))
        if status == PX_ERR_TIMEOUT && !r.settled
            message = unsafe_string(px_last_error())
            # Either still pending, or completed since (its result is px_test's), or
            # failed by the daemon's stall deadline (step_stall_ms), also a TIMEOUT.
            done = Ref{Int32}(0)
            tested = px_test(h, done)
            if done[] == 0
                if time() >= deadline
                    message = replace(message, r"within \d+ ms" =>
                                      "within $(timeout_ms(timeout)) ms")
                    throw(ParallaxError(PX_ERR_TIMEOUT, message))
                end
                yield()
                continue
            end
            status = tested
        end
        settle!(r)
        status == PX_OK && return nothing
        throw(request_error(r, status))
    end
end

"""
    isready(r::Request) -> Bool

Whether the operation completed, without blocking; throws if it failed.
"""
function Base.isready(r::Request)
    done = Ref{Int32}(0)
    status = px_test(open_handle(r), done)
    done[] == 0 && status == PX_OK && return false
    done[] != 0 && settle!(r)
    status == PX_OK && return true
    throw(request_error(r, status))
end

"""
    wait_async(r::Request; timeout = 30)

Like `wait`, but sleeps in the event loop on the client's completion fd
(`px_client_fd`, `px_progress`) instead of in a blocking call.
"""
function wait_async(r::Request; timeout::Real = 30.0)
    deadline = time() + timeout
    fd = client_fd(r.client)
    while !isready(r)
        left = deadline - time()
        left <= 0 && throw(ParallaxError(PX_ERR_TIMEOUT,
                                         "the request did not complete within $(timeout_ms(timeout)) ms"))
        poll_fd(fd, left; readable = true)
        progress(r.client)
    end
    return nothing
end

"""
    cancel!(r::Request)

Cancels the operation (`px_request_cancel`): once it returns, nothing writes its output and
`wait` throws `PX_ERR_CANCELLED` (unless it already returned the result).
"""
function cancel!(r::Request)
    status = px_request_cancel(open_handle(r))
    status == PX_OK && settle!(r)
    check(status)
end

function Base.close(r::Request)
    Threads.atomic_xchg!(r.freed, true) && return nothing
    if !r.settled && px_request_cancel(r.handle) == PX_OK
        settle!(r)
    end
    px_request_free(r.handle)  # ordinary memory is never written after this
    r.buffers = ()
    return nothing
end

function op_options(root::Integer)
    o = Ref{PxOpOptions}()
    px_op_options_init(o)
    return Ref(with(o[]; root = root))
end

# Submits through call(options, out_request) and wraps the request; out (an ArenaBuffer)
# counts it in flight. The caller preserves the buffers across the call.
function submit(call, client::Client, out, buffers::Tuple; root::Integer = 0)
    for b in buffers
        b isa ArenaBuffer && b.freed[] &&
            throw(ArgumentError("an ArenaBuffer given to an operation was closed"))
    end
    req = Ref{Ptr{Cvoid}}(C_NULL)
    check(call(op_options(root), req))
    arena = out isa ArenaBuffer ? out : nothing
    arena === nothing || Threads.atomic_add!(arena.busy, 1)
    return Request(req[], client, buffers, arena)
end

function expect_len(name, what, buffer, len, want)
    len == want && return nothing
    throw(ParallaxError(PX_ERR_INVALID, "$what('$name'): $buffer has $len elements, $want expected"))
end

# --- dense variables -----------------------------------------------------------------
"""
    DenseVar{T}

A registered dense variable of `count` elements of `T`, from [`register_dense`](@ref).
"""
struct DenseVar{T<:Element}
    client::Client
    handle::Ptr{Cvoid}
    name::String
    count::Int
end

const REDUCE_OPS = Dict(:sum => PX_SUM, :mean => PX_MEAN, :min => PX_MIN, :max => PX_MAX,
                        :prod => PX_PROD)

function lookup(table, what, key)
    haskey(table, key) || throw(ArgumentError("unknown $what :$key; one of $(sort(collect(keys(table))))"))
    return table[key]
end

"""
    register_dense(c::Client, name, T, count; op = :sum) -> DenseVar{T}

`op` is `:sum`, `:mean`, `:min`, `:max` or `:prod`. Every worker registers the same name with the
same `T`, `count` and `op`, else `PX_ERR_MISMATCH`.
"""
function register_dense(c::Client, name::AbstractString, ::Type{T}, count::Integer;
                        op::Symbol = :sum) where {T<:Element}
    h = Ref{Ptr{Cvoid}}(C_NULL)
    check(px_register_dense(c.handle, cstring_arg("variable name", name), dtype(T), count,
                            lookup(REDUCE_OPS, "reduce op", op), h))
    return DenseVar{T}(c, h[], String(name), Int(count))
end

function stats(handle::Ptr{Cvoid})
    st = Ref(PxVarStats(sizeof(PxVarStats), zeros(UInt64, fieldcount(PxVarStats) - 1)...))
    check(px_var_stats_get(handle, st))
    return st[]
end

"""
    allreduce!(v::DenseVar{T}, out, input = out) -> Request

Reduces `input` across every worker into `out` (`count` elements each; in place when
they are the same array).
"""
function allreduce!(v::DenseVar{T}, out::DenseArray{T}, input::DenseArray{T} = out) where {T}
    expect_len(v.name, "allreduce", "out", length(out), v.count)
    expect_len(v.name, "allreduce", "input", length(input), v.count)
    GC.@preserve out input begin
        submit(v.client, out, (out, input)) do o, req
            px_allreduce_ex(v.handle, pointer(input), pointer(out), o, req)
        end
    end
end

"""
    bcast!(v::DenseVar{T}, out, input = out; root = 0) -> Request

Copies worker `root`'s (global rank) `input` into every worker's `out` (`px_broadcast`).
`input` is read on the root only; elsewhere it may be `nothing`.
"""
function bcast!(v::DenseVar{T}, out::DenseArray{T},
                input::Union{Nothing,DenseArray{T}} = out; root::Integer = 0) where {T}
    world = v.client.world
    0 <= root < world.world_size ||
        throw(ParallaxError(PX_ERR_INVALID, "broadcast('$(v.name)'): root $root is not a rank " *
                                            "of the job (0..$(world.world_size - 1))"))
    expect_len(v.name, "broadcast", "out", length(out), v.count)
    if input === nothing
        world.rank == root && throw(ParallaxError(PX_ERR_INVALID,
            "broadcast('$(v.name)'): this worker is the root (rank $root) and gave no input"))
    else
        expect_len(v.name, "broadcast", "input", length(input), v.count)
    end
    GC.@preserve out input begin
        submit(v.client, out, (out, input); root = root) do o, req
            px_broadcast_ex(v.handle, input === nothing ? C_NULL : pointer(input), pointer(out),
                            o, req)
        end
    end
end

"""
    allgather!(v::DenseVar{T}, out, input) -> Request

Every worker's `input` (`count` elements) concatenated in rank order into `out`
(`world_size * count` elements).
"""
function allgather!(v::DenseVar{T}, out::DenseArray{T}, input::DenseArray{T}) where {T}
    expect_len(v.name, "allgather", "input", length(input), v.count)
    expect_len(v.name, "allgather", "out", length(out), v.count * v.client.world.world_size)
    GC.@preserve out input begin
        submit(v.client, out, (out, input)) do o, req
            px_allgather_ex(v.handle, pointer(input), pointer(out), o, req)
        end
    end
end

"""
    allgatherv!(v::DenseVar{T}, out, input, counts) -> Request

Blocks of given sizes: `counts` has one entry per rank (the same on every worker, each at
most `count`), `input` holds `counts[rank + 1]` elements and `out` their sum.
"""
function allgatherv!(v::DenseVar{T}, out::DenseArray{T}, input::DenseArray{T},
                     counts::AbstractVector{<:Integer}) where {T}
    world = v.client.world
    length(counts) == world.world_size ||
        throw(ParallaxError(PX_ERR_INVALID, "allgatherv('$(v.name)'): counts has " *
                                            "$(length(counts)) entries, the world has $(world.world_size) workers"))
    c = Vector{UInt64}(counts)
    expect_len(v.name, "allgatherv", "input", length(input), Int(c[world.rank+1]))
    expect_len(v.name, "allgatherv", "out", length(out), Int(sum(c)))
    GC.@preserve out input c begin
        submit(v.client, out, (out, input)) do o, req
            px_allgatherv_ex(v.handle, pointer(input), pointer(c), pointer(out), o, req)
        end
    end
end

"""
    reduce_scatter!(v::DenseVar{T}, out, input) -> Request

`input` holds a block of `count` elements per rank; each block is reduced across every
worker with the variable's op and this rank's block lands in `out` (`count` elements).
"""
function reduce_scatter!(v::DenseVar{T}, out::DenseArray{T}, input::DenseArray{T}) where {T}
    expect_len(v.name, "reduce_scatter", "input", length(input), v.count * v.client.world.world_size)
    expect_len(v.name, "reduce_scatter", "out", length(out), v.count)
    GC.@preserve out input begin
        submit(v.client, out, (out, input)) do o, req
            px_reduce_scatter_ex(v.handle, pointer(input), pointer(out), o, req)
        end
    end
end

"""
    alltoall!(v::DenseVar{T}, out, input) -> Request

Block `k` of `input` (`count` elements each, in rank order) goes to rank `k`; block `s` of
`out` comes from rank `s`.
"""
function alltoall!(v::DenseVar{T}, out::DenseArray{T}, input::DenseArray{T}) where {T}
    n = v.count * v.client.world.world_size
    expect_len(v.name, "alltoall", "input", length(input), n)
    expect_len(v.name, "alltoall", "out", length(out), n)
    GC.@preserve out input begin
        submit(v.client, out, (out, input)) do o, req
            px_alltoall_ex(v.handle, pointer(input), pointer(out), o, req)
        end
    end
end

"""
    alltoallv!(v::DenseVar{T}, out, input, send_counts, recv_counts) -> Request

Blocks of given sizes: `send_counts[k + 1]` elements of `input` go to rank `k`,
`recv_counts[s + 1]` elements of `out` come from rank `s` (each at most `count`).
"""
function alltoallv!(v::DenseVar{T}, out::DenseArray{T}, input::DenseArray{T},
                    send_counts::AbstractVector{<:Integer},
                    recv_counts::AbstractVector{<:Integer}) where {T}
    world = v.client.world
    (length(send_counts) == world.world_size && length(recv_counts) == world.world_size) ||
        throw(ParallaxError(PX_ERR_INVALID, "alltoallv('$(v.name)'): $(length(send_counts)) " *
                                            "send and $(length(recv_counts)) receive counts for $(world.world_size) workers"))
    s = Vector{UInt64}(send_counts)
    r = Vector{UInt64}(recv_counts)
    expect_len(v.name, "alltoallv", "input", length(input), Int(sum(s)))
    expect_len(v.name, "alltoallv", "out", length(out), Int(sum(r)))
    GC.@preserve out input s r begin
        submit(v.client, out, (out, input)) do o, req
            px_alltoallv_ex(v.handle, pointer(input), pointer(s), pointer(out), pointer(r), o, req)
        end
    end
end

# --- sparse variables ----------------------------------------------------------------
"""
    SparseVar

A registered sparse `rows` x `dim` Float32 table, from [`register_sparse`](@ref). Row
indices are 0-based table rows, as in the C ABI. A row buffer holds `dim` values per
index, row i (in index order) at `(i-1)*dim+1 : i*dim`: a `dim` x n `Matrix{Float32}`
has one row of the table per column.
"""
struct SparseVar
    client::Client
    handle::Ptr{Cvoid}
    name::String
    rows::Int
    dim::Int
end

const OPTIMIZERS = Dict(:sgd => PX_OPT_SGD, :adagrad => PX_OPT_ADAGRAD, :adam => PX_OPT_ADAM)
const INITIALIZERS = Dict(:zeros => PX_INIT_ZEROS, :uniform => PX_INIT_UNIFORM,
                          :normal => PX_INIT_NORMAL)
const CONSISTENCIES = Dict(:sync => PX_SYNC, :async => PX_ASYNC, :bounded => PX_BOUNDED)
const ROUTES = Dict(:hybrid => PX_ROUTE_HYBRID, :ps => PX_ROUTE_PS,
                    :allgatherv => PX_ROUTE_ALLGATHERV, :allreduce => PX_ROUTE_ALLREDUCE,
                    :alltoall => PX_ROUTE_ALLTOALL, :auto => PX_ROUTE_AUTO)
const NONFINITE = Dict(:reject => PX_NONFINITE_REJECT, :skip => PX_NONFINITE_SKIP)
const SPLITS = Dict(:rows => PX_SPLIT_ROWS, :columns => PX_SPLIT_COLUMNS)
const WIRE_DTYPES = Dict(:f32 => PX_F32, :bf16 => PX_BF16, :f16 => PX_F16)
const SYMBOL_OPTIONS = Dict(:optimizer => ("optimizer", OPTIMIZERS),
                            :initializer => ("initializer", INITIALIZERS),
                            :aggregation => ("aggregation", REDUCE_OPS),
                            :consistency => ("consistency", CONSISTENCIES),
                            :route => ("route", ROUTES), :nonfinite => ("nonfinite", NONFINITE),
                            :alltoall_split => ("alltoall split", SPLITS),
                            :wire_dtype => ("wire dtype", WIRE_DTYPES))

"""
    register_sparse(c::Client, name, rows, dim; options...) -> SparseVar

Options (defaults from `px_sparse_options_init`): `optimizer` (`:sgd`, `:adagrad`,
`:adam`), `learning_rate`, `beta1`, `beta2`, `epsilon`, `initial_accumulator`,
`initializer` (`:zeros`, `:uniform` with `init_low`/`init_high`, `:normal` with
`init_std`), `init_seed`, `aggregation` (`:sum`, `:mean`), `consistency` (`:sync`,
`:async`, `:bounded` with `staleness`), `partitions` (0: automatic), `route` (`:hybrid`:
`:auto` for a `:sync` table, `:ps` otherwise; `:ps`, `:allgatherv`, `:allreduce`, `:alltoall`,
`:auto`), `alltoall_split` (`:rows`, `:columns`:
how `:alltoall` divides the table), `nonfinite` (`:reject`, `:skip`), `wire_dtype`
(`:f32`, or lossy `:bf16`/`:f16` rows and gradients between nodes), `prefetch` (ABI 1.6;
`true`: the next pull step may be issued with [`prefetch_rows!`](@ref) before this push
step, and its rows no node pulled in this step are served at once, EmbRace's relaxed
dependency; a worker's push step n may then only push rows its own pull step n pulled,
else `PX_ERR_INVALID`; `:ps`, `:hybrid` and `:alltoall` routes; default `false`),
`cache_rows` and `cache_staleness` (ABI 1.14: a hot-row cache on a `:bounded` table of the
`:ps` or `:hybrid` route; 0 rows: none), `replicas` (ABI 1.16: 2 keeps a copy of each
node's partitions on the next node, handed to the job's next run when a node is lost;
membership on etcd and `:sync`; default 1). Every
worker registers the table with the same options, else `PX_ERR_MISMATCH`.
"""
function register_sparse(c::Client, name::AbstractString, rows::Integer, dim::Integer; options...)
    init = Ref{PxSparseOptions}()
    px_sparse_options_init(init)
    fields = Dict{Symbol,Any}()
    for (k, v) in options
        k in (:struct_size, :reserved0, :reserved1, :reserved2) && throw(ArgumentError("register_sparse: $k is not an option"))
        Base.hasfield(PxSparseOptions, k) ||
            throw(ArgumentError("register_sparse: unknown option $k"))
        fields[k] = haskey(SYMBOL_OPTIONS, k) ? lookup(SYMBOL_OPTIONS[k][2], SYMBOL_OPTIONS[k][1], v) : v
    end
    h = Ref{Ptr{Cvoid}}(C_NULL)
    check(px_register_sparse(c.handle, cstring_arg("variable name", name), PX_F32, rows, dim,
                             Ref(with(init[]; fields...)), h))
    return SparseVar(c, h[], String(name), Int(rows), Int(dim))
end

"""
    Parallax.stats(v::Union{DenseVar,SparseVar}) -> PxVarStats

The daemon's counters for a variable on this node (`px_var_stats_get`).
"""
stats(v::Union{DenseVar,SparseVar}) = stats(v.handle)

function rows_op(call, what, s::SparseVar, indices::DenseVector{Int64}, rows::DenseArray{Float32},
                 out)
    want = length(indices) * s.dim
    length(rows) == want ||
        throw(ParallaxError(PX_ERR_INVALID, "$what('$(s.name)'): $(length(indices)) indices need " *
                                            "$(length(indices)) x $(s.dim) = $want values, the buffer has $(length(rows))"))
    GC.@preserve indices rows begin
        submit(s.client, out, (indices, rows)) do o, req
            call(s.handle, pointer(indices), length(indices), pointer(rows), o, req)
        end
    end
end

"""
    pull_rows!(s::SparseVar, out, indices) -> Request

Pull step: `out` gets the rows' values (`px_pull_rows`). An index outside `[0, rows)` fails
the request with `PX_ERR_INDEX` naming it.
"""
pull_rows!(s::SparseVar, out::DenseArray{Float32}, indices::DenseVector{Int64}) =
    rows_op(px_pull_rows_ex, "pull_rows", s, indices, out, out)

"""
    prefetch_rows!(s::SparseVar, out, indices) -> Request

(ABI 1.6) The next pull step, issued ahead: exactly [`pull_rows!`](@ref)
(`px_prefetch_rows`), typically before the push of the step in progress, on a table
registered with `prefetch = true` (else `PX_ERR_INVALID`). In `:sync` the result is the
same as a pull issued after that push, never a stale row.
"""
prefetch_rows!(s::SparseVar, out::DenseArray{Float32}, indices::DenseVector{Int64}) =
    rows_op(px_prefetch_rows_ex, "prefetch_rows", s, indices, out, out)

"""
    push_rows(s::SparseVar, indices, grads) -> Request

Push step: gradients for the rows, duplicates summed (`px_push_rows`).
"""
push_rows(s::SparseVar, indices::DenseVector{Int64}, grads::DenseArray{Float32}) =
    rows_op(px_push_rows_ex, "push_rows", s, indices, grads, nothing)

"""
    load_rows(s::SparseVar, indices, values) -> Request

Overwrites the rows' values (`px_load_rows`); with duplicates the last one wins.
"""
load_rows(s::SparseVar, indices::DenseVector{Int64}, values::DenseArray{Float32}) =
    rows_op(px_load_rows_ex, "load_rows", s, indices, values, nothing)

"""
    read_rows!(s::SparseVar, out, indices) -> Request

Reads the rows' current values, not a step (`px_read_rows`).
"""
read_rows!(s::SparseVar, out::DenseArray{Float32}, indices::DenseVector{Int64}) =
    rows_op(px_read_rows_ex, "read_rows", s, indices, out, out)
