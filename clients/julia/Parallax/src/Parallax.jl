"""
    Parallax

Julia bindings to libparallax, the C ABI (1.16) of the `parallaxd` communication daemon:
dense collectives (allreduce, broadcast, allgather(v)) and sparse tables held by the
daemons (pull/push rows), through `ccall` only.

```julia
using Parallax
c = Parallax.connect(job = "train", local_size = 2)
g = register_dense(c, "grad", Float32, 4; op = :mean)
buf = ones(Float32, 4)
wait(allreduce!(g, buf); timeout = 30)
close(c)
```

The library is `libparallax` on the loader path, or the path in `ENV["PARALLAX_LIB"]`.
"""
module Parallax

using FileWatching: poll_fd

# Not exported: connect (Sockets has one), stats; call them as Parallax.connect etc.
export Client, DenseVar, SparseVar, Request, ArenaBuffer, ParallaxError, WorldInfo
export world, barrier, checkpoint, abort!, alloc, register_dense, register_sparse
export allreduce!, bcast!, allgather!, allgatherv!, reduce_scatter!, alltoall!, alltoallv!
export pull_rows!, prefetch_rows!, push_rows, load_rows, read_rows!, cancel!, wait_async

include("lib.jl")

function __init__()
    LIBPARALLAX[] = get(ENV, "PARALLAX_LIB", "libparallax")
end

"""
    ParallaxError(status, message)

A failed call or operation: `status` is the `px_status` (compare with `Parallax.PX_ERR_INDEX`
and friends), `message` the library's or daemon's words (for an operation, its node,
worker, variable and step).
"""
struct ParallaxError <: Exception
    status::Cint
    message::String
end

"""
    status_name(status) -> String

The C name of a status, `"PX_ERR_TIMEOUT"`.
"""
status_name(status::Integer) = unsafe_string(px_status_name(Cint(status)))

function Base.showerror(io::IO, e::ParallaxError)
    print(io, "ParallaxError(", status_name(e.status), "): ",
          isempty(e.message) ? unsafe_string(px_strerror(e.status)) : e.message)
end

# The thread's px_last_error is the message of the call that just failed on this thread.
# No task switch can come between two ccalls without a yield point, so reading it right
# after the call reads that call's message.
function check(status::Cint)
    status == PX_OK && return nothing
    throw(ParallaxError(status, unsafe_string(px_last_error())))
end

abi_version() = (v = px_abi_version(); (Int(v >> 16), Int(v & 0xffff)))

# Milliseconds for the C API from seconds, rounded up so a short wait is not a poll.
timeout_ms(seconds::Real) = seconds <= 0 ? Int64(0) : Int64(min(ceil(seconds * 1000), 2^62))

function cstring_arg(what, s::AbstractString)
    occursin('\0', s) && throw(ArgumentError("$what $(repr(s)) contains a NUL byte"))
    return String(s)
end

include("client.jl")
include("ops.jl")

end # module
