# The connection to the node's parallaxd, and memory in its shared arena.

"""
    WorldInfo

Where this worker sits in the job. Ranks and indices are 0-based, as in the C ABI (they
name workers and nodes, not Julia array positions).
"""
struct WorldInfo
    node_index::Int
    node_count::Int
    rank::Int
    world_size::Int
    local_rank::Int
    local_size::Int
end

"""
    Client

A connection to the node's parallaxd (`px_client`), from [`Parallax.connect`](@ref).
`close(c)` disconnects; a client that becomes unreachable is disconnected by its finalizer.
Every function may be used from any task or thread (libparallax's handles are ids in a
locked table, and the C ABI allows any thread).
"""
mutable struct Client
    handle::Ptr{Cvoid}
    world::WorldInfo
    arenas::Threads.Atomic{Int}  # open ArenaBuffers: their memory goes with the client
    closed::Threads.Atomic{Bool}
end

"""
    Parallax.connect(; socket, job, local_rank, local_size, timeout, arena_bytes,
                     wait_for_daemon) -> Client

Connects (`px_connect`), waiting until every local worker of the job has. Options left out
take libparallax's defaults, which read `PARALLAX_SOCKET`, `PARALLAX_JOB`,
`PARALLAX_LOCAL_RANK`, `PARALLAX_LOCAL_SIZE`, `PARALLAX_ARENA_BYTES` and
`PARALLAX_WAIT_FOR_DAEMON`. `timeout` is in seconds (default 30): the deadline for
connecting and for control calls.
"""
function connect(; socket::Union{Nothing,AbstractString} = nothing,
                 job::Union{Nothing,AbstractString} = nothing,
                 local_rank::Union{Nothing,Integer} = nothing,
                 local_size::Union{Nothing,Integer} = nothing,
                 timeout::Union{Nothing,Real} = nothing,
                 arena_bytes::Union{Nothing,Integer} = nothing,
                 wait_for_daemon::Union{Nothing,Bool} = nothing)
    init = Ref{PxConnectOptions}()
    px_connect_options_init_abi(init, PX_ABI_VERSION)  # the daemon tells it the statuses it knows
    sock = socket === nothing ? nothing : cstring_arg("socket path", socket)
    jobname = job === nothing ? nothing : cstring_arg("job name", job)
    fields = Dict{Symbol,Any}()
    local_rank === nothing || (fields[:local_rank] = local_rank)
    local_size === nothing || (fields[:local_size] = local_size)
    timeout === nothing || (fields[:timeout_ms] = timeout_ms(timeout))
    arena_bytes === nothing || (fields[:arena_bytes] = arena_bytes)
    wait_for_daemon === nothing || (fields[:wait_for_daemon] = wait_for_daemon ? 1 : 0)
    handle = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve sock jobname begin
        sock === nothing || (fields[:socket_path] = pointer(sock))
        jobname === nothing || (fields[:job_name] = pointer(jobname))
        check(px_connect(Ref(with(init[]; fields...)), handle))
    end
    info = Ref(PxWorldInfo(sizeof(PxWorldInfo), 0, 0, 0, 0, 0, 0))
    status = px_world(handle[], info)
    if status != PX_OK
        err = ParallaxError(status, unsafe_string(px_last_error()))
        px_disconnect(handle[])
        throw(err)
    end
    w = info[]
    c = Client(handle[], WorldInfo(w.node_index, w.node_count, w.rank, w.world_size,
                                   w.local_rank, w.local_size),
               Threads.Atomic{Int}(0), Threads.Atomic{Bool}(false))
    return finalizer(c) do c
        # Unreachable, so no ArenaBuffer of it is either; those collected with it only
        # hand their blocks back (a stale handle then, which libparallax refuses cleanly).
        Threads.atomic_xchg!(c.closed, true) || px_disconnect(c.handle)
    end
end

"""
    world(c::Client) -> WorldInfo
"""
world(c::Client) = c.world

Base.show(io::IO, c::Client) = print(io, "Parallax.Client(", c.world, c.closed[] ? ", closed)" : ")")

"""
    close(c::Client)

Disconnects (`px_disconnect`): the client's variables, requests and arena go with it. Refused
while an [`ArenaBuffer`](@ref) of the client is open, since its memory would be unmapped.
"""
function Base.close(c::Client)
    n = c.arenas[]
    n > 0 && throw(ArgumentError("close(::Client): $n ArenaBuffer(s) of this client are " *
                                 "open; close them first (their memory goes with the client)"))
    Threads.atomic_xchg!(c.closed, true) && return nothing
    check(px_disconnect(c.handle))
end

Base.isopen(c::Client) = !c.closed[]

"""
    barrier(c::Client; timeout = 30)

Returns once every worker of the job, on every node, has entered (`px_barrier`). A barrier
that times out is withdrawn, so it never releases the others.
"""
barrier(c::Client; timeout::Real = 30.0) = check(px_barrier(c.handle, timeout_ms(timeout)))

"""
    checkpoint(c::Client, dir; timeout = 30)

Writes every sparse variable of the job to `dir` (`px_checkpoint`); call it between steps,
e.g. after a [`barrier`](@ref), from one worker.
"""
checkpoint(c::Client, dir::AbstractString; timeout::Real = 30.0) =
    check(px_checkpoint(c.handle, cstring_arg("checkpoint path", dir), max(timeout_ms(timeout), 1)))

"""
    abort!(c::Client, reason)

Fails the job on every node at once with `reason` (`px_abort`). The client stays valid
for closing requests and itself.
"""
abort!(c::Client, reason::AbstractString) =
    check(px_abort(c.handle, cstring_arg("abort reason", reason)))

"""
    last_error(c::Client) -> String

The message of the last failed call made with this client, on any thread.
"""
function last_error(c::Client)
    len = Ref{UInt64}(0)
    px_client_last_error(c.handle, C_NULL, 0, len) == PX_OK || return ""
    buf = Vector{UInt8}(undef, len[] + 1)
    px_client_last_error(c.handle, buf, length(buf), len) == PX_OK || return ""
    return String(buf[1:min(len[], length(buf) - 1)])
end

"""
    client_fd(c::Client) -> RawFD

A level-triggered fd, readable when a request of the client may have completed
(`px_client_fd`); [`wait_async`](@ref) waits on it. Owned by the client: do not close it.
"""
function client_fd(c::Client)
    fd = Ref{Cint}(-1)
    check(px_client_fd(c.handle, fd))
    return RawFD(fd[])
end

"""
    progress(c::Client)

Takes the completions the daemon has posted, without blocking (`px_progress`).
"""
progress(c::Client) = check(px_progress(c.handle))

# --- element types -------------------------------------------------------------------
"""
The element types libparallax reduces. bfloat16 is not exposed (no Base type for it).
"""
const Element = Union{Float32,Float64,Float16,Int32,Int64}

dtype(::Type{Float32}) = PX_F32
dtype(::Type{Float64}) = PX_F64
dtype(::Type{Float16}) = PX_F16
dtype(::Type{Int32}) = PX_I32
dtype(::Type{Int64}) = PX_I64

# --- arena memory --------------------------------------------------------------------
"""
    ArenaBuffer{T} <: DenseVector{T}

Elements in the arena shared with the daemon (`px_alloc`), from [`alloc`](@ref):
operations on it need no staging copy. `close(b)` frees it (a finalizer does otherwise).
While an operation that writes it is in flight the daemon may write it at any time: a
buffer whose request was collected or closed before completing without a successful
cancel is never freed (it leaks rather than be reused under the daemon).
"""
mutable struct ArenaBuffer{T} <: DenseVector{T}
    ptr::Ptr{T}
    len::Int
    client::Client
    busy::Threads.Atomic{Int}  # operations in flight that write it
    freed::Threads.Atomic{Bool}
end

"""
    alloc(c::Client, T, n) -> ArenaBuffer{T}

`n` zeroed elements of `T` in the client's shared arena.
"""
function alloc(c::Client, ::Type{T}, n::Integer) where {T<:Element}
    n >= 0 || throw(ArgumentError("alloc: negative length $n"))
    p = Ref{Ptr{Cvoid}}(C_NULL)
    n > 0 && check(px_alloc(c.handle, n * sizeof(T), p))
    ptr = Ptr{T}(p[])
    for i in 1:n  # a reused block keeps its old bytes
        unsafe_store!(ptr, zero(T), i)
    end
    b = ArenaBuffer{T}(ptr, n, c, Threads.Atomic{Int}(0), Threads.Atomic{Bool}(n == 0))
    n > 0 && Threads.atomic_add!(c.arenas, 1)
    return finalizer(release!, b)
end

# The finalizer, and close: hands the block back, unless an operation may still write it
# (its request was collected or closed before completing, without a successful cancel):
# then the block is leaked, never reused under the daemon.
function release!(b::ArenaBuffer)
    Threads.atomic_xchg!(b.freed, true) && return nothing
    b.busy[] == 0 && px_free(b.client.handle, Ptr{Cvoid}(b.ptr))
    Threads.atomic_sub!(b.client.arenas, 1)
    return nothing
end

function Base.close(b::ArenaBuffer)
    b.busy[] > 0 && throw(ArgumentError(
        "close(::ArenaBuffer): an operation that writes it is still in flight"))
    return release!(b)
end

Base.size(b::ArenaBuffer) = (b.len,)
Base.IndexStyle(::Type{<:ArenaBuffer}) = IndexLinear()
function Base.getindex(b::ArenaBuffer, i::Int)
    @boundscheck checkbounds(b, i)
    b.freed[] && throw(ArgumentError("ArenaBuffer used after close"))
    return GC.@preserve b unsafe_load(b.ptr, i)
end
function Base.setindex!(b::ArenaBuffer{T}, v, i::Int) where {T}
    @boundscheck checkbounds(b, i)
    b.freed[] && throw(ArgumentError("ArenaBuffer used after close"))
    GC.@preserve b unsafe_store!(b.ptr, convert(T, v), i)
    return b
end
Base.pointer(b::ArenaBuffer) = b.ptr
Base.unsafe_convert(::Type{Ptr{T}}, b::ArenaBuffer{T}) where {T} = b.ptr
Base.elsize(::Type{ArenaBuffer{T}}) where {T} = sizeof(T)
Base.strides(::ArenaBuffer) = (1,)
